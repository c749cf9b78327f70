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

# torchtitan's get_peak_flops answers A100's figure for any name it does not know (with a warning).
A100_BF16 = 312e12
# Physical NeuronCores per logical core that torchtitan's Neuron entry assumes (it multiplies by this).
TORCHTITAN_NEURON_LNC = {"trn1": 1, "trn1n": 1, "inf2": 1}  # trn2, trn3: 2


@dataclass(frozen=True)
class Shape:
    """What the FLOPs count needs of a decoder whose layers are all alike (dense, or all MoE)."""

    vocab: int
    dim: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_hidden: int = 0  # dense layers: the SwiGLU width
    experts: int = 0  # MoE layers: routed experts, how many each token uses, and each one's width
    top_k: int = 0
    expert_hidden: int = 0


@dataclass(frozen=True)
class Peak:
    flops: float | None  # per device (per logical NeuronCore on Trainium); None: no MFU
    source: str  # where the figure comes from, or why there is none


def active_matmul_params(shape: Shape) -> int:
    s = shape
    attention = s.dim * s.head_dim * (2 * s.heads + 2 * s.kv_heads)  # wq, wo; wk, wv
    if s.experts:
        ffn = s.dim * s.experts + s.top_k * 3 * s.dim * s.expert_hidden  # router + the experts a token uses
    else:
        ffn = 3 * s.dim * s.ffn_hidden  # w1, w2, w3
    return s.layers * (attention + ffn) + s.dim * s.vocab  # + the output head, tied or not


def per_token(shape: Shape, seq_len: int) -> int:
    """Training FLOPs per token (forward and backward) at `seq_len`."""
    return 6 * active_matmul_params(shape) + 12 * shape.layers * shape.heads * shape.head_dim * seq_len


def shape_of(model_config) -> Shape:
    """The Shape of torchtitan's native Qwen3 config, or of the transformers backend's (HF attribute names)."""
    if hasattr(model_config, "layers"):  # torchtitan's Decoder.Config (native and nki_moe)
        layer = model_config.layers[0]
        attention, moe = layer.attention, layer.moe
        common = dict(vocab=model_config.vocab_size, dim=model_config.dim, layers=len(model_config.layers),
                      heads=attention.n_heads, kv_heads=attention.n_kv_heads or attention.n_heads,
                      head_dim=attention.head_dim or model_config.dim // attention.n_heads)
        if moe is not None:
            return Shape(**common, experts=moe.num_experts, top_k=moe.router.top_k,
                         expert_hidden=moe.routed_experts.inner_experts.hidden_dim)
        return Shape(**common, ffn_hidden=layer.feed_forward.w1.out_features)
    c = model_config  # the transformers backend: the Hugging Face config's attributes, copied onto its Config
    heads = c.num_attention_heads
    common = dict(vocab=c.vocab_size, dim=c.hidden_size, layers=c.num_hidden_layers, heads=heads,
                  kv_heads=getattr(c, "num_key_value_heads", None) or heads,
                  head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads)
    if getattr(c, "num_experts", None):
        return Shape(**common, experts=c.num_experts, top_k=c.num_experts_per_tok,
                     expert_hidden=c.moe_intermediate_size)
    return Shape(**common, ffn_hidden=c.intermediate_size)


def peak(device_type: str, device_name: str, logical_nc_config: int = 2) -> Peak:
    """bf16 peak FLOPS of one device of this run, from torchtitan's table; None (with why) where it has none."""
    if device_type == "cpu":
        return Peak(None, "CPU: no agreed peak FLOPS for a host CPU, so no MFU")
    from torchtitan.tools.utils import get_peak_flops

    if device_type == "neuron":
        # UNCONFIRMED on hardware: torchtitan's entry reads the chip from torch_neuronx's device properties
        chip = _neuron_chip()
        per_core = get_peak_flops("neuron") / TORCHTITAN_NEURON_LNC.get(chip, 2)
        return Peak(per_core * logical_nc_config,
                    f"torchtitan get_peak_flops, Neuron entry ({chip}): {per_core / 1e12:g} TFLOPS bf16 per "
                    f"physical NeuronCore x LNC={logical_nc_config}")
    flops = get_peak_flops(device_name)
    if flops == A100_BF16 and "A100" not in device_name:
        return Peak(None, f"{device_name!r} is not in torchtitan's peak table (it would assume an A100)")
    return Peak(flops, f"torchtitan get_peak_flops: {device_name} bf16")


def _neuron_chip() -> str:
    from torchtitan.tools.utils import device_module

    return device_module.get_device_properties().name
