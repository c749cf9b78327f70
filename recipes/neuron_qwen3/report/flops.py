"""One FLOPs count for every variant, and the honest peak to divide it by.

torchtitan 0.3.0 counts FLOPs per model family, and the counts disagree: the native Qwen3 spec counts
attention over `2 * head_dim` and the tied output head once, while the transformers backend
(`get_dense_model_nparams_and_flops` with `head_dims=head_dim`) halves the attention term, leaves a tied head
out and, for MoE, counts every expert as active. Its MFU is therefore not comparable with the native
variants'. Here the count comes from the model's shape alone, the same way for all three variants:

    per token = 6 * (active matmul weights) + 12 * layers * heads * head_dim * seq_len

6 = 2 FLOPs per multiply-add x 3 (forward + backward); the active matmul weights are the q/k/v/o projections,
the dense FFN or the router plus `top_k` experts, and the output head (a tied head still multiplies); the
attention term is QK^T and AV (2 matmuls of heads*head_dim*seq each, x2 FLOPs, x3), causal sparsity not
discounted (the PaLM convention torchtitan follows). Norm weights and the embedding lookup are not matmuls.

Peaks: torchtitan's table (`torchtitan.tools.utils.get_peak_flops`) for GPUs and its Neuron entry for
Trainium; a host CPU has no peak anyone agrees on, so there MFU is `None` with the reason.
"""

from dataclasses import dataclass

from neuron_qwen3.shapes import Shape

# torchtitan's get_peak_flops answers A100's figure for any name it does not know (with a warning).
A100_BF16 = 312e12
# Physical NeuronCores per logical core that torchtitan's Neuron entry assumes (it multiplies by this).
TORCHTITAN_NEURON_LNC = {"trn1": 1, "trn1n": 1, "inf2": 1}  # trn2, trn3: 2


@dataclass(frozen=True)
class Peak:
    flops: float | None  # per device (per logical NeuronCore on Trainium); None: no MFU
    source: str  # where the figure comes from, or why there is none


def active_matmul_params(shape: Shape) -> int:
    s = shape
    attention = s.dim * s.head_dim * (2 * s.n_heads + 2 * s.n_kv_heads)  # wq, wo; wk, wv
    if s.num_experts:
        ffn = s.dim * s.num_experts + s.top_k * 3 * s.dim * s.hidden_dim  # router + the experts a token uses
    else:
        ffn = 3 * s.dim * s.hidden_dim  # w1, w2, w3
    return s.n_layers * (attention + ffn) + s.dim * s.vocab_size  # + the output head, tied or not


def per_token(shape: Shape, seq_len: int) -> int:
    """Training FLOPs per token (forward and backward) at `seq_len`."""
    return 6 * active_matmul_params(shape) + 12 * shape.n_layers * shape.n_heads * shape.head_dim * seq_len


def peak(device_type: str, device_name: str, logical_nc_config: int = 2) -> Peak:
    """bf16 peak FLOPS of one device of this run, from torchtitan's table; None (with why) where it has none."""
    if device_type == "cpu":
        return Peak(None, "CPU: no agreed peak FLOPS for a host CPU, so no MFU")
    from torchtitan.tools.utils import get_peak_flops

    if device_type == "neuron":
        # UNCONFIRMED on hardware: torchtitan's entry reads the chip from torch_neuronx's device properties
        chip = _neuron_chip()
        per_core = get_peak_flops("neuron") / TORCHTITAN_NEURON_LNC.get(chip, 2)
        return Peak(
            per_core * logical_nc_config,
            f"torchtitan get_peak_flops, Neuron entry ({chip}): {per_core / 1e12:g} TFLOPS bf16 per "
            f"physical NeuronCore x LNC={logical_nc_config}",
        )
    flops = get_peak_flops(device_name)
    if flops == A100_BF16 and "A100" not in device_name:
        return Peak(None, f"{device_name!r} is not in torchtitan's peak table (it would assume an A100)")
    return Peak(flops, f"torchtitan get_peak_flops: {device_name} bf16")


def _neuron_chip() -> str:
    from torchtitan.tools.utils import device_module

    return device_module.get_device_properties().name
