"""The Neuron seam: nkilib's blockwise MoE kernels as torch ops on TorchNeuron.

The only module of the recipe that touches `torch_neuronx`, `nki` or `nkilib`, and only inside
functions: importing it is free anywhere. `nki_experts.py` calls `moe_cte_forward` and
`blockwise_mm_backward` when its op runs on a `neuron` device (or when NEURON_QWEN3_MOE_KERNEL=nki);
off Neuron they raise ImportError naming the missing package.

    forward:  nkilib.core.moe.moe_cte.moe_cte, implementation shard_on_i with
              checkpoint_activation=True -> (out [T+1, H], gate_up_activations_T [N, 2, I, B],
              down_activations [N, B, H]); affinities applied after the down projection
              (POST_SCALE, the default), SiLU, bf16 compute.
    backward: nkilib.experimental.moe.bwd.blockwise_mm_backward.blockwise_mm_bwd (dropless), fed
              the two checkpoints -> grads of hidden_states [T+1, H], affinities [(T+1)*E, 1],
              gate_up_proj_weight [E, H, 2, I], down_proj_weight [E, I, H].

The ops take torchtitan's weight layout (w1/w3 [E, F, D], w2 [E, D, F]); the packing into the
kernels' gate_up_proj_weight [E, H, 2, I] / down_proj_weight [E, I, H] and the unpacking of their
gradients happen here, with moe_layout's pack/unpack functions.

Checked against the nki-library sources (signatures, shapes, the [T+1, H] output and the
padding conventions) and the torch-neuronx "work with NKI" guide; nothing here has run on a
Trainium. UNCONFIRMED, to check on the first Trainium run:
  * `wrap_nki(kernel)[lnc](...)` on `moe_cte`, which is declared `@nki.jit(mode="trace")` (a
    dispatch wrapper), rather than on the implementation it dispatches to;
  * passing the `MoECTESpec` dataclass through `wrap_nki` as a compile-time argument;
  * that moe_cte shard_on_i's checkpoints are in the layout blockwise_mm_bwd reads (the shapes
    agree; nkilib's own backward tests produce them with experimental.moe.forward.bwmm_shard_on_H);
  * blockwise_mm_bwd taking hidden_states and the output gradient as [T+1, H] (its docstring says
    [T, H]; nkilib's tests and the JAX integrations pass T+1 rows with a zero last row, as here);
  * the dtype the kernels want for expert_affinities_masked (we pass the compute dtype, bf16);
  * whether torch.compile(backend="neuron") lowers our outer torch.library op, whose eager
    implementation calls these nki_op ops (eager mode calls them directly either way).
"""

import functools
import os

import torch

from neuron_qwen3.moe_layout import pack_down, pack_gate_up, unpack_down, unpack_gate_up

__all__ = [
    "BWD_BLOCK_SIZES",
    "blockwise_mm_backward",
    "check_kernel_shapes",
    "logical_nc_config",
    "moe_cte_forward",
]

BWD_BLOCK_SIZES = (128, 256, 512, 1024)  # blockwise_mm_bwd's MOEBwdParameters.validate()
_DMA_TRANSPOSE_MULTIPLE = 32  # H and I, per logical core, must be multiples of this (validate_sharding)


def logical_nc_config() -> int:
    """LNC degree of the kernels: the runtime's NEURON_LOGICAL_NC_CONFIG (trn2 default 2).

    The kernel's LNC must equal the graph's (error NCC_EVRF066), so both read the same variable.
    """
    return int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", "2"))


def check_kernel_shapes(hidden_dim: int, intermediate_dim: int, block_size: int, lnc: int) -> None:
    """Fail early, in words, on the shapes nkilib's backward kernel rejects. Pure Python."""
    problems = []
    if block_size not in BWD_BLOCK_SIZES:
        problems.append(f"block_size={block_size} (blockwise_mm_bwd takes {BWD_BLOCK_SIZES})")
    for name, size in (("hidden dim H", hidden_dim), ("expert hidden dim I", intermediate_dim)):
        if size % (lnc * _DMA_TRANSPOSE_MULTIPLE):
            problems.append(f"{name}={size} (must be a multiple of {_DMA_TRANSPOSE_MULTIPLE} x LNC {lnc})")
    if problems:
        raise ValueError("nki_moe kernels cannot take " + "; ".join(problems))


def _missing(package: str, pip_name: str, error: ImportError) -> ImportError:
    return ImportError(
        f"nki_moe kernel path: the Neuron package '{package}' is not importable ({error}). "
        f"It comes with the Neuron SDK ({pip_name} from https://pip.repos.neuron.amazonaws.com) and "
        "runs only on Trainium. Off Trainium the experts run the PyTorch reference: leave "
        "NEURON_QWEN3_MOE_KERNEL unset (or set it to 'reference')."
    )


@functools.cache
def _kernel_ops():
    """Import the Neuron packages and register the two kernels as torch ops (once per process)."""
    try:
        from torch_neuronx import nki_op, wrap_nki
    except ImportError as e:
        raise _missing("torch_neuronx", "torch-neuronx", e) from e
    try:
        from nkilib.core.moe.moe_cte import MoECTEImplementation, MoECTESpec, ShardOnIConfig, moe_cte
        from nkilib.experimental.moe.bwd.blockwise_mm_backward import blockwise_mm_bwd
    except ImportError as e:
        raise _missing("nkilib", "neuronx-cc, which bundles nkilib", e) from e

    lnc = logical_nc_config()
    spec = MoECTESpec(
        implementation=MoECTEImplementation.shard_on_i,
        shard_on_I=ShardOnIConfig(checkpoint_activation=True, expert_affinity_multiply_on_I=False),
    )

    # Registration as in the torch-neuronx guide: @nki_op("ns::name", mutates_args={}) on a typed
    # function whose body calls wrap_nki(kernel)[grid](...), the grid being the LNC degree.
    @nki_op("neuron_qwen3_nki::moe_cte", mutates_args={})
    def moe_cte_op(
        hidden_states: torch.Tensor,
        expert_affinities_masked: torch.Tensor,
        gate_up_proj_weight: torch.Tensor,
        down_proj_weight: torch.Tensor,
        token_position_to_id: torch.Tensor,
        block_to_expert: torch.Tensor,
        block_size: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return wrap_nki(moe_cte)[lnc](
            hidden_states,
            expert_affinities_masked,
            gate_up_proj_weight,
            down_proj_weight,
            token_position_to_id,
            block_to_expert,
            block_size,
            spec,
        )

    @nki_op("neuron_qwen3_nki::blockwise_mm_bwd", mutates_args={})
    def blockwise_mm_bwd_op(
        hidden_states: torch.Tensor,
        expert_affinities_masked: torch.Tensor,
        gate_up_proj_weight: torch.Tensor,
        down_proj_weight: torch.Tensor,
        gate_up_proj_act_checkpoint_T: torch.Tensor,
        down_proj_act_checkpoint: torch.Tensor,
        token_position_to_id: torch.Tensor,
        block_to_expert: torch.Tensor,
        output_hidden_states_grad: torch.Tensor,
        block_size: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return wrap_nki(blockwise_mm_bwd)[lnc](
            hidden_states,
            expert_affinities_masked,
            gate_up_proj_weight,
            down_proj_weight,
            gate_up_proj_act_checkpoint_T,
            down_proj_act_checkpoint,
            token_position_to_id,
            block_to_expert,
            output_hidden_states_grad,
            block_size,
        )

    return moe_cte_op, blockwise_mm_bwd_op


def moe_cte_forward(
    hidden_states: torch.Tensor,
    expert_affinities_masked: torch.Tensor,
    w1_EFD: torch.Tensor,
    w3_EFD: torch.Tensor,
    w2_EDF: torch.Tensor,
    token_position_to_id: torch.Tensor,
    block_to_expert: torch.Tensor,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_cte with checkpoints: (out [T, H], gate_up_activations_T [N, 2, I, B], down_activations [N, B, H]).

    Weights come in torchtitan's layout and are packed here into the kernel's.
    """
    moe_cte_op, _ = _kernel_ops()
    _, intermediate_dim, hidden_dim = w1_EFD.shape
    check_kernel_shapes(hidden_dim, intermediate_dim, block_size, logical_nc_config())
    out_T1H, gate_up_act_T, down_act = moe_cte_op(
        hidden_states,
        expert_affinities_masked,
        pack_gate_up(w1_EFD, w3_EFD),
        pack_down(w2_EDF),
        token_position_to_id,
        block_to_expert,
        block_size,
    )
    return out_T1H[:-1].clone(), gate_up_act_T, down_act  # row T is the padding token's


def blockwise_mm_backward(
    grad_output: torch.Tensor,
    hidden_states: torch.Tensor,
    expert_affinities_masked: torch.Tensor,
    w1_EFD: torch.Tensor,
    w3_EFD: torch.Tensor,
    w2_EDF: torch.Tensor,
    gate_up_act_T: torch.Tensor,
    down_act: torch.Tensor,
    token_position_to_id: torch.Tensor,
    block_to_expert: torch.Tensor,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """blockwise_mm_bwd: grads of (hidden_states, affinities, w1, w3, w2), weights in torchtitan's layout."""
    _, blockwise_mm_bwd_op = _kernel_ops()
    _, intermediate_dim, hidden_dim = w1_EFD.shape
    check_kernel_shapes(hidden_dim, intermediate_dim, block_size, logical_nc_config())
    # The kernel reads T+1 gradient rows like the hidden states; the padding token's is zero.
    grad_T1H = torch.cat([grad_output, grad_output.new_zeros(1, grad_output.shape[1])]).to(hidden_states.dtype)
    grad_hidden, grad_affinities, grad_gate_up, grad_down = blockwise_mm_bwd_op(
        hidden_states,
        expert_affinities_masked,
        pack_gate_up(w1_EFD, w3_EFD),
        pack_down(w2_EDF),
        gate_up_act_T,
        down_act,
        token_position_to_id,
        block_to_expert,
        grad_T1H,
        block_size,
    )
    grad_w1, grad_w3 = unpack_gate_up(grad_gate_up)
    return grad_hidden, grad_affinities, grad_w1, grad_w3, unpack_down(grad_down)
