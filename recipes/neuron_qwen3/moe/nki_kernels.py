"""The Neuron seam: nkilib's blockwise MoE kernels, and its token-generation MoE kernel, as torch ops on TorchNeuron,
and their shape limits.

The only module of moe/ that touches `torch_neuronx`, `nki` (through neuron_sdk.py) or `nkilib`, and only inside
functions: importing it is free anywhere. `experts.py` calls `moe_cte_forward` and `blockwise_mm_backward` when its
op runs on a `neuron` device (or when its kernel is forced to nki), and `moe_tkg_forward` there for a generator's
decode step (no autograd, rows that `decode_fits`); off Neuron they raise ImportError naming the missing package.

    forward:  nkilib.core.moe.moe_cte.moe_cte, implementation shard_on_i with
              checkpoint_activation=True -> (out [T+1, H], gate_up_activations_T [N, 2, I, B],
              down_activations [N, B, H]); affinities applied after the down projection
              (POST_SCALE, the default), SiLU, bf16 compute.
    backward: nkilib.experimental.moe.bwd.blockwise_mm_backward.blockwise_mm_bwd (dropless), fed
              the two checkpoints -> grads of hidden_states [T+1, H], affinities [(T+1)*E, 1],
              gate_up_proj_weight [E, H, 2, I], down_proj_weight [E, I, H].
    decode:   nkilib.core.moe.moe_tkg.moe_tkg.moe_tkg, selective experts (is_all_expert=False), bf16, each
              routed row one "token" with K=1: expert_index [R, 1] int32 its expert, expert_affinities [R, E]
              fp32 one-hot (as nkilib's selective tests give them), POST_SCALE, SiLU -> out [R, H]. The
              training kernel would compute a block of 256 rows for each expert a decode step routes to; this
              one computes the R rows.

The forward is called the way AWS's own torch wrapper of moe_cte calls it (vllm-neuron): flat
scalars and the implementation enum go into our own `@nki.jit(mode="trace")` function, which builds
the `MoECTESpec` inside the trace, and the torch side calls `wrap_nki(that)[lnc](**kwargs)`; no
dataclass crosses `wrap_nki`. The ops take torchtitan's weight layout; the packing into the kernels'
gate_up_proj_weight [E, H, 2, I] / down_proj_weight [E, I, H] and back happens here (layout.py).

Checked against the nki-library sources (tag 2.29: signatures, shapes, the [T+1, H] output, the
padding conventions, the limits in KERNEL_LIMITS) and the torch-neuronx "work with NKI" guide;
nothing here has run on a Trainium (the self-test, `--self-test`, is the first check there).
UNCONFIRMED until then:
  * that moe_cte shard_on_i's checkpoints are in the layout blockwise_mm_bwd reads (the shapes
    agree; nkilib's own backward tests produce them with experimental.moe.forward.bwmm_shard_on_H);
  * blockwise_mm_bwd taking hidden_states and the output gradient as [T+1, H] (its docstring says
    [T, H]; nkilib's tests and the JAX integrations pass T+1 rows with a zero last row, as here);
  * the dtype the kernels want for expert_affinities_masked (we pass the compute dtype, bf16);
  * whether torch.compile(backend="neuron") lowers our outer torch.library op, whose eager
    implementation calls these nki_op ops (eager mode calls them directly either way);
  * moe_tkg in selective mode with bf16 rows and weights (nkilib tests it in fp16 from HBM, in bf16 from SBUF),
    with up to 128 rows (its documented limit; its selective tests go to 32), and at LNC 1 (its tests use 2).
The decode op packs every expert's weights at each call, as the training ops do: a copy of the layer's experts
per decode step, which a generation round could keep instead.
"""

import functools
from typing import NamedTuple

import torch

from neuron_qwen3 import neuron_sdk

from neuron_qwen3.moe.layout import (
    BlockLayout,
    ExpertWeights,
    pack_down,
    pack_gate_up,
    unpack_down,
    unpack_gate_up,
)

__all__ = [
    "KERNEL_LIMITS",
    "blockwise_mm_backward",
    "check_kernel_shapes",
    "decode_fits",
    "moe_cte_forward",
    "moe_tkg_forward",
]

BWD_BLOCK_SIZES = (128, 256, 512, 1024)
DMA_TRANSPOSE_MULTIPLE = 32

# Every limit of both kernels (nki-library tag 2.29), as (what it says, test on (H, I, B, LNC)).
# moe_cte shard_on_i: check_blockwise_mm_shard_I_kernel_compatibility (core/moe/moe_cte/bwmm_shard_on_I.py);
# blockwise_mm_bwd: MOEBwdParameters.validate / validate_sharding (experimental/moe/bwd). Together they leave
# blocks of 256, 512 and 1024; Qwen3-30B-A3B (H 2048, I 768) fits at 256.
KERNEL_LIMITS = (
    ("moe_cte: block size B a multiple of 256", lambda h, i, b, lnc: b % 256 == 0),
    ("moe_cte: hidden dim H from 512 to 8192", lambda h, i, b, lnc: 512 <= h <= 8192),
    ("moe_cte: hidden dim H a multiple of 512", lambda h, i, b, lnc: h % 512 == 0),
    ("moe_cte: expert hidden dim I a multiple of 16", lambda h, i, b, lnc: i % 16 == 0),
    (
        f"blockwise_mm_bwd: block size B one of {', '.join(map(str, BWD_BLOCK_SIZES))}",
        lambda h, i, b, lnc: b in BWD_BLOCK_SIZES,
    ),
    (
        f"blockwise_mm_bwd: hidden dim H per logical core (H / LNC) a multiple of {DMA_TRANSPOSE_MULTIPLE}",
        lambda h, i, b, lnc: h % (lnc * DMA_TRANSPOSE_MULTIPLE) == 0,
    ),
    (
        f"blockwise_mm_bwd: expert hidden dim I per logical core (I / LNC) a multiple of {DMA_TRANSPOSE_MULTIPLE}",
        lambda h, i, b, lnc: i % (lnc * DMA_TRANSPOSE_MULTIPLE) == 0,
    ),
)


def check_kernel_shapes(hidden_dim: int, intermediate_dim: int, block_size: int, lnc: int) -> None:
    """Raise ValueError, one line naming each limit broken and the values, on shapes the kernels reject."""
    broken = [text for text, holds in KERNEL_LIMITS if not holds(hidden_dim, intermediate_dim, block_size, lnc)]
    if broken:
        raise ValueError(
            f"nki_moe kernels cannot take H={hidden_dim}, I={intermediate_dim}, B={block_size}, "
            f"LNC={lnc}: needs " + "; ".join(broken)
        )


DECODE_MAX_ROWS = 128  # moe_tkg's T <= 128
DECODE_DTYPES = (torch.bfloat16, torch.float16)  # moe_tkg's unquantized inputs
H_TILE = 128  # moe_tkg loads the hidden states as [128, T, H / 128], split over the LNC's cores when T is 1


def decode_fits(rows: int, hidden_dim: int, dtype: torch.dtype, lnc: int) -> bool:
    """Whether moe_tkg takes a decode step's routed rows; where it does not, the training kernel computes them."""
    return rows <= DECODE_MAX_ROWS and dtype in DECODE_DTYPES and hidden_dim % (H_TILE * lnc) == 0


SEAM = neuron_sdk.Seam("nki_moe kernel path", "the experts run", "NEURON_QWEN3_MOE_KERNEL")


class KernelOps(NamedTuple):
    """The three kernels as torch ops, each built for one LNC."""

    moe_cte: object
    blockwise_mm_bwd: object
    moe_tkg: object


@functools.cache
def _kernel_ops(lnc: int) -> KernelOps:
    """Import the Neuron packages and register the three kernels as torch ops (once per process and LNC)."""
    nki_op, wrap_nki, nki = SEAM.torch_neuronx_and_nki()
    try:
        from nkilib.core.moe.moe_cte import MoECTEImplementation, MoECTESpec, ShardOnIConfig, moe_cte
        from nkilib.core.moe.moe_tkg.moe_tkg import moe_tkg
        from nkilib.core.utils.common_types import ActFnType, ExpertAffinityScaleMode
        from nkilib.experimental.moe.bwd.blockwise_mm_backward import blockwise_mm_bwd
    except ImportError as e:
        raise SEAM.missing("nkilib", "neuronx-cc, which bundles nkilib", e) from e

    @nki.jit(mode="trace")
    def moe_cte_training(
        hidden_states,
        expert_affinities_masked,
        gate_up_proj_weight,
        down_proj_weight,
        token_position_to_id,
        block_to_expert,
        block_size: int,
        implementation,
        checkpoint_activation: bool,
        expert_affinity_multiply_on_I: bool,
    ):
        """moe_cte with its spec built inside the trace from flat scalars (vllm-neuron's pattern)."""
        spec = MoECTESpec(
            implementation=implementation,
            shard_on_I=ShardOnIConfig(
                checkpoint_activation=checkpoint_activation, expert_affinity_multiply_on_I=expert_affinity_multiply_on_I
            ),
        )
        return moe_cte(
            hidden_states=hidden_states,
            expert_affinities_masked=expert_affinities_masked,
            gate_up_proj_weight=gate_up_proj_weight,
            down_proj_weight=down_proj_weight,
            token_position_to_id=token_position_to_id,
            block_to_expert=block_to_expert,
            block_size=block_size,
            spec=spec,
        )

    # Registration as in the torch-neuronx guide: @nki_op("ns::name", mutates_args={}) on a typed
    # function whose body calls wrap_nki(kernel)[grid](...), the grid being the LNC degree.
    @nki_op(f"neuron_qwen3_nki::moe_cte_lnc{lnc}", mutates_args={})  # one op per LNC: each is built for one
    def moe_cte_op(
        hidden_states: torch.Tensor,
        expert_affinities_masked: torch.Tensor,
        gate_up_proj_weight: torch.Tensor,
        down_proj_weight: torch.Tensor,
        token_position_to_id: torch.Tensor,
        block_to_expert: torch.Tensor,
        block_size: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return wrap_nki(moe_cte_training)[lnc](
            hidden_states=hidden_states,
            expert_affinities_masked=expert_affinities_masked,
            gate_up_proj_weight=gate_up_proj_weight,
            down_proj_weight=down_proj_weight,
            token_position_to_id=token_position_to_id,
            block_to_expert=block_to_expert,
            block_size=block_size,
            implementation=MoECTEImplementation.shard_on_i,
            checkpoint_activation=True,
            expert_affinity_multiply_on_I=False,
        )

    @nki_op(f"neuron_qwen3_nki::blockwise_mm_bwd_lnc{lnc}", mutates_args={})
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
            hidden_states=hidden_states,
            expert_affinities_masked=expert_affinities_masked,
            gate_up_proj_weight=gate_up_proj_weight,
            down_proj_weight=down_proj_weight,
            gate_up_proj_act_checkpoint_T=gate_up_proj_act_checkpoint_T,
            down_proj_act_checkpoint=down_proj_act_checkpoint,
            token_position_to_id=token_position_to_id,
            block_to_expert=block_to_expert,
            output_hidden_states_grad=output_hidden_states_grad,
            block_size=block_size,
        )

    @nki.jit(mode="trace")
    def moe_tkg_decode(hidden_input, expert_gate_up_weights, expert_down_weights, expert_affinities, expert_index):
        """moe_tkg, selective, its enums chosen inside the trace."""
        return moe_tkg(
            hidden_input=hidden_input,
            expert_gate_up_weights=expert_gate_up_weights,
            expert_down_weights=expert_down_weights,
            expert_affinities=expert_affinities,
            expert_index=expert_index,
            is_all_expert=False,
            expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE,
            activation_fn=ActFnType.SiLU,
        )

    @nki_op(f"neuron_qwen3_nki::moe_tkg_lnc{lnc}", mutates_args={})
    def moe_tkg_op(
        hidden_input: torch.Tensor,
        expert_gate_up_weights: torch.Tensor,
        expert_down_weights: torch.Tensor,
        expert_affinities: torch.Tensor,
        expert_index: torch.Tensor,
    ) -> torch.Tensor:
        return wrap_nki(moe_tkg_decode)[lnc](
            hidden_input=hidden_input,
            expert_gate_up_weights=expert_gate_up_weights,
            expert_down_weights=expert_down_weights,
            expert_affinities=expert_affinities,
            expert_index=expert_index,
        )

    return KernelOps(moe_cte_op, blockwise_mm_bwd_op, moe_tkg_op)


def moe_tkg_forward(x_RH: torch.Tensor, expert_of_row: torch.Tensor, weights: ExpertWeights, lnc: int) -> torch.Tensor:
    """moe_tkg on routed rows: out [R, H], row r through expert expert_of_row[r] (E: none, a zero row), with no
    routing weight (torchtitan's combine applies it after the experts)."""
    rows, hidden_dim = x_RH.shape
    assert decode_fits(rows, hidden_dim, x_RH.dtype, lnc), (
        f"moe_tkg cannot take {rows} rows of {hidden_dim} {x_RH.dtype}"
    )
    num_experts = weights.w1_EFD.shape[0]
    # a row of no expert (expert_of_row E) gets affinity 0 at expert E - 1: zero, as in the blockwise path
    affinities = torch.nn.functional.one_hot(expert_of_row.long(), num_experts + 1)[:, :num_experts].float()
    return _kernel_ops(lnc).moe_tkg(
        x_RH,
        pack_gate_up(weights.w1_EFD, weights.w3_EFD),
        pack_down(weights.w2_EDF),
        affinities,
        expert_of_row.clamp(max=num_experts - 1).to(torch.int32)[:, None],
    )


def _checked(weights: ExpertWeights, layout: BlockLayout, lnc: int) -> None:
    _, intermediate_dim, hidden_dim = weights.shape
    check_kernel_shapes(hidden_dim, intermediate_dim, layout.block_size, lnc)


def moe_cte_forward(
    hidden_states: torch.Tensor,
    expert_affinities_masked: torch.Tensor,
    weights: ExpertWeights,
    layout: BlockLayout,
    lnc: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_cte with checkpoints: (out [T, H], gate_up_activations_T [N, 2, I, B], down_activations [N, B, H])."""
    _checked(weights, layout, lnc)
    out_T1H, gate_up_act_T, down_act = _kernel_ops(lnc).moe_cte(
        hidden_states,
        expert_affinities_masked,
        pack_gate_up(weights.w1_EFD, weights.w3_EFD),
        pack_down(weights.w2_EDF),
        layout.token_position_to_id,
        layout.block_to_expert,
        layout.block_size,
    )
    return out_T1H[:-1].clone(), gate_up_act_T, down_act  # row T is the padding token's


def blockwise_mm_backward(
    grad_output: torch.Tensor,
    hidden_states: torch.Tensor,
    expert_affinities_masked: torch.Tensor,
    weights: ExpertWeights,
    checkpoints: tuple[torch.Tensor, torch.Tensor],
    layout: BlockLayout,
    lnc: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """blockwise_mm_bwd: grads of (hidden_states, affinities, w1, w3, w2), weights in torchtitan's layout."""
    _checked(weights, layout, lnc)
    gate_up_act_T, down_act = checkpoints
    # The kernel reads T+1 gradient rows like the hidden states; the padding token's is zero.
    grad_T1H = torch.cat([grad_output, grad_output.new_zeros(1, grad_output.shape[1])]).to(hidden_states.dtype)
    grad_hidden, grad_affinities, grad_gate_up, grad_down = _kernel_ops(lnc).blockwise_mm_bwd(
        hidden_states,
        expert_affinities_masked,
        pack_gate_up(weights.w1_EFD, weights.w3_EFD),
        pack_down(weights.w2_EDF),
        gate_up_act_T,
        down_act,
        layout.token_position_to_id,
        layout.block_to_expert,
        grad_T1H,
        layout.block_size,
    )
    grad_w1, grad_w3 = unpack_gate_up(grad_gate_up)
    return grad_hidden, grad_affinities, grad_w1, grad_w3, unpack_down(grad_down)
