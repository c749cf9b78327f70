"""Qwen3 MoE routed experts on nkilib's blockwise kernels, swapped in by torchtitan's override registry.

Enable with `--override.imports neuron_qwen3.nki_experts.nki_grouped_experts` (the nki_moe recipe
sets it in `config.override.imports`). Settings ride along as override kwargs, e.g.
`'neuron_qwen3.nki_experts.nki_grouped_experts={"block_size": 256}'`.

One op, `torch.ops.neuron_qwen3.blockwise_moe_experts`, computes the experts in nkilib's blockwise
layout (see moe_layout.py); the weights come in torchtitan's layout (gate w1 [E, F, D], up
w3 [E, F, D], down w2 [E, D, F]; F = I, D = H):

    (hidden_states [T+1, H], expert_affinities_masked [(T+1)*E, 1], w1, w3, w2,
     token_position_to_id [N*B], block_to_expert [N, 1], block_size)
      -> out [T, H], gate_up_activations_T [N, 2, I, B], down_activations [N, B, H]

    for each block n with expert e = block_to_expert[n] and slot tokens t = token_position_to_id[nB:(n+1)B]:
        gate, up = x[t] @ w1[e]^T, x[t] @ w3[e]^T            (row T of x, the padding token, is zeros)
        down     = (silu(gate) * up) @ w2[e]^T
        out[t]  += affinity[t, e] * down                       (routing weight AFTER the expert)

The last two outputs are the activation checkpoints the backward consumes, in the kernels' layout;
`blockwise_moe_experts()` returns just `out`. On a `neuron` device the op runs nkilib's `moe_cte` and
`blockwise_mm_bwd` through nki_kernels.py, which packs the weights into the kernels' layout
(gate_up_proj_weight [E, H, 2, I], down_proj_weight [E, I, H]: moe_layout.pack_*) and unpacks the
weight gradients. Elsewhere it runs a PyTorch reference of the same blocked computation (same
gather through token_position_to_id, same zero padding row, same per-block experts, same affinity
post-scaling and scatter-add), forward and backward. Packing inside the op keeps the reference
free of weight-sized copies (at Qwen3-30B-A3B size they cost more than the expert matmuls on
CPU) and lands the gradients in torchtitan's layout.
NEURON_QWEN3_MOE_KERNEL=auto|nki|reference picks the path (auto: nki on neuron devices).

How it replaces torchtitan's GroupedExperts (torchtitan/models/common/moe.py): RoutedExperts calls
`inner_experts(x_RD, num_tokens_per_expert_E)` with the routed rows already sorted by expert
(LocalTokenDispatcher: stable argsort; the EP dispatchers: grouped per local expert), and applies
the routing scores itself, in `token_dispatcher.combine`, after the experts. So NKIGroupedExperts
treats each routed row as one "token" of the kernel: token_position_to_id maps block slots to
rows, block_to_expert comes from the counts, and the affinities are 1 at (row, its expert) -- the
kernel's post-scaling is then the identity and combine applies the real scores exactly as it does
for torchtitan's experts. The expert math and its dtype follow GroupedExperts.forward: inputs and
weights cast to bf16, silu(x w1^T) * (x w3^T) w2^T, result cast back to the input dtype.
"""

import functools
import os
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from torchtitan.config.override import derive, override
from torchtitan.models.common.moe import GroupedExperts
from torchtitan.tools.logging import logger

from neuron_qwen3 import nki_kernels
from neuron_qwen3.moe_layout import BlockLayout, max_num_blocks, presorted_block_layout

__all__ = [
    "KERNEL_ENV",
    "NKIGroupedExperts",
    "blockwise_moe_experts",
    "kernel_path",
    "layout_unit_affinities",
    "nki_grouped_experts",
    "reference_backward",
    "reference_forward",
]

KERNEL_ENV = "NEURON_QWEN3_MOE_KERNEL"
_KERNEL_CHOICES = ("auto", "nki", "reference")
_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def kernel_path(device: torch.device) -> Literal["nki", "reference"]:
    """Which implementation the op runs for tensors on `device`: NKI on Neuron, else the reference."""
    choice = os.environ.get(KERNEL_ENV, "auto").strip().lower() or "auto"
    if choice not in _KERNEL_CHOICES:
        raise ValueError(f"{KERNEL_ENV}={choice!r}: expected one of {_KERNEL_CHOICES}")
    if choice == "auto":
        return "nki" if device.type == "neuron" else "reference"
    return choice


@functools.cache
def _log_kernel_path(path: str, device_type: str) -> None:
    # The integration tests grep for "nki_moe kernel path: <path>".
    logger.info(
        f"nki_moe kernel path: {path} (device {device_type}, "
        f"{KERNEL_ENV}={os.environ.get(KERNEL_ENV, 'auto')})"
    )


# ---- the PyTorch reference of the blocked computation ------------------------------------------


def _block_runs(block_to_expert: torch.Tensor, block_size: int) -> list[tuple[int, int, int]]:
    """(expert, first slot, end slot) for each run of consecutive blocks with the same expert.

    Blocks come sorted by expert, so this is one run per expert with blocks; the reference does
    one matmul per run instead of per block, which is the same arithmetic row by row.
    """
    experts, run_blocks = torch.unique_consecutive(block_to_expert.reshape(-1), return_counts=True)
    runs, start = [], 0
    for expert, num in zip(experts.tolist(), run_blocks.tolist()):
        runs.append((expert, start * block_size, (start + num) * block_size))
        start += num
    return runs


def _slot_indices(
    token_position_to_id: torch.Tensor, block_to_expert: torch.Tensor, block_size: int, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block slot: the token row it reads, and the flat index of its affinity (token*E + expert)."""
    token_P = token_position_to_id.to(torch.int64)
    expert_P = block_to_expert.reshape(-1).to(torch.int64).repeat_interleave(block_size)
    return token_P, token_P * num_experts + expert_P


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _token_slot_table(token_P: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[T, m] table of each token's block slots, in slot order (m = most slots of any token: K under
    top-k routing, 1 for GroupedExperts' rows); unused entries hold P, one past the last slot.

    The scatter-add back to tokens is then a gather and a sum over m (index_add_ loops over rows
    on CPU). Slots of the padding token (id T) are left out.
    """
    num_slots = token_P.shape[0]
    slot_ids = torch.nonzero(token_P < num_tokens).squeeze(1)
    tokens = token_P[slot_ids]
    order = torch.argsort(tokens, stable=True)
    slot_ids, tokens = slot_ids[order], tokens[order]
    per_token = torch.bincount(tokens, minlength=num_tokens)
    width = int(per_token.max()) if tokens.numel() else 0
    rank = torch.arange(tokens.numel(), device=tokens.device) - (torch.cumsum(per_token, 0) - per_token)[tokens]
    table = torch.full((num_tokens, width), num_slots, dtype=torch.int64, device=token_P.device)
    table[tokens, rank] = slot_ids
    return table


def _sum_over_slots(values_P1D: torch.Tensor, table_TM: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """out[t] = sum of values_P1D[p] over the slots p of token t, accumulated in `acc`.

    values_P1D has one extra last row of zeros, which the table's unused entries point at.
    One slot per token (GroupedExperts' rows) is a plain gather, in the values' dtype.
    """
    num_tokens, width = table_TM.shape
    if width <= 1:
        if width == 0:
            return values_P1D.new_zeros(num_tokens, values_P1D.shape[1])
        return values_P1D.index_select(0, table_TM[:, 0])
    out = values_P1D.index_select(0, table_TM[:, 0]).to(acc)
    for j in range(1, width):  # slot order; no [T, m, D] temporary
        out += values_P1D.index_select(0, table_TM[:, j])
    return out


def _with_zero_row(num_rows: int, like: torch.Tensor) -> torch.Tensor:
    """An uninitialised [num_rows + 1, D] buffer whose last row is zero."""
    buffer = like.new_empty(num_rows + 1, like.shape[-1])
    buffer[num_rows].zero_()
    return buffer


def reference_forward(
    hidden_states: torch.Tensor,
    expert_affinities_masked: torch.Tensor,
    w1_EFD: torch.Tensor,
    w3_EFD: torch.Tensor,
    w2_EDF: torch.Tensor,
    token_position_to_id: torch.Tensor,
    block_to_expert: torch.Tensor,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_cte in PyTorch: (out [T, H], gate_up_activations_T [N, 2, I, B], down_activations [N, B, H]).

    Matmuls and SwiGLU run in the dtype of the inputs (as GroupedExperts' bf16 grouped GEMMs do).
    Like nkilib's own torch reference of moe_cte, each affinity-scaled block output is rounded to
    that dtype and the sum over a token's experts accumulates in (at least) fp32.
    """
    num_rows, dim = hidden_states.shape  # T+1
    num_experts, hidden, _ = w1_EFD.shape
    num_blocks = block_to_expert.shape[0]
    num_slots = num_blocks * block_size
    token_P, affinity_index_P = _slot_indices(token_position_to_id, block_to_expert, block_size, num_experts)
    runs = _block_runs(block_to_expert, block_size)

    x_PD = hidden_states.index_select(0, token_P)  # gather; padding slots read the zero row T
    gate_PF = hidden_states.new_empty(num_slots, hidden)
    up_PF = hidden_states.new_empty(num_slots, hidden)
    down_PD = hidden_states.new_empty(num_slots, dim)
    for expert, start, stop in runs:
        torch.mm(x_PD[start:stop], w1_EFD[expert].t(), out=gate_PF[start:stop])
        torch.mm(x_PD[start:stop], w3_EFD[expert].t(), out=up_PF[start:stop])
    h_PF = F.silu(gate_PF) * up_PF  # elementwise over all slots at once; only the matmuls go per run
    for expert, start, stop in runs:
        torch.mm(h_PF[start:stop], w2_EDF[expert].t(), out=down_PD[start:stop])

    affinity_P = expert_affinities_masked.reshape(-1).index_select(0, affinity_index_P)
    scaled_P1D = _with_zero_row(num_slots, down_PD)
    torch.mul(down_PD, affinity_P.unsqueeze(1), out=scaled_P1D[:num_slots])  # (promoted) product, rounded once
    table_TM = _token_slot_table(token_P, num_rows - 1)
    out_TD = _sum_over_slots(scaled_P1D, table_TM, _accumulation_dtype(hidden_states.dtype))
    gate_up_act_T = torch.stack(
        [gate_PF.view(num_blocks, block_size, hidden).transpose(1, 2),
         up_PF.view(num_blocks, block_size, hidden).transpose(1, 2)],
        dim=1,
    )
    return out_TD.to(hidden_states.dtype), gate_up_act_T, down_PD.view(num_blocks, block_size, dim)


def _repeated_runs(runs: list[tuple[int, int, int]]) -> list[bool]:
    """For each run, whether an earlier run had the same expert (only if blocks are not sorted)."""
    seen: set[int] = set()
    repeated = []
    for expert, _, _ in runs:
        repeated.append(expert in seen)
        seen.add(expert)
    return repeated


def _mm_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, accumulate: bool) -> None:
    if accumulate:
        out.addmm_(a, b)
    else:
        torch.mm(a, b, out=out)


def reference_backward(
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
    affinity_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """blockwise_mm_bwd in PyTorch, from the forward's checkpoints (no forward recompute).

    Returns grads of (hidden_states [T+1, H], expert_affinities_masked [(T+1)*E, 1], w1, w3, w2),
    each in its input's dtype and layout. Experts without blocks get zero gradients. With
    `affinity_grad` False (constant affinities, as NKIGroupedExperts passes) the affinity
    gradient, a dot product per slot, is skipped and returned as zeros.
    """
    num_rows, dim = hidden_states.shape
    num_experts, hidden, _ = w1_EFD.shape
    num_blocks = block_to_expert.shape[0]
    num_slots = num_blocks * block_size
    dtype = hidden_states.dtype
    acc = _accumulation_dtype(dtype)
    token_P, affinity_index_P = _slot_indices(token_position_to_id, block_to_expert, block_size, num_experts)
    runs = _block_runs(block_to_expert, block_size)
    again = _repeated_runs(runs)  # a second run of the same expert accumulates its weight grads

    grad_T1D = _with_zero_row(num_rows - 1, grad_output)  # the padding token's output grad is zero
    grad_T1D[: num_rows - 1] = grad_output
    grad_PD = grad_T1D.index_select(0, token_P)
    down_PD = down_act.view(num_slots, dim)
    affinity_P = expert_affinities_masked.reshape(-1).index_select(0, affinity_index_P)
    grad_down_PD = torch.empty_like(down_PD)
    torch.mul(grad_PD, affinity_P.unsqueeze(1), out=grad_down_PD)  # what the expert outputs see
    grad_affinity = torch.zeros(num_rows * num_experts, dtype=acc, device=grad_output.device)

    gate_PF = gate_up_act_T[:, 0].transpose(1, 2).reshape(num_slots, hidden)
    up_PF = gate_up_act_T[:, 1].transpose(1, 2).reshape(num_slots, hidden)
    act_PF = F.silu(gate_PF)
    h_PF = act_PF * up_PF
    grad_w1, grad_w3, grad_w2 = torch.empty_like(w1_EFD), torch.empty_like(w3_EFD), torch.empty_like(w2_EDF)
    grad_h_PF = hidden_states.new_empty(num_slots, hidden)
    for (expert, start, stop), accumulate in zip(runs, again):
        if affinity_grad:  # d affinity = <grad, down>, in fp32 a run at a time; padding slots add 0
            dot = (grad_PD[start:stop].to(acc) * down_PD[start:stop].to(acc)).sum(dim=1)
            grad_affinity.index_add_(0, affinity_index_P[start:stop], dot)
        _mm_into(grad_w2[expert], grad_down_PD[start:stop].t(), h_PF[start:stop], accumulate)
        torch.mm(grad_down_PD[start:stop], w2_EDF[expert], out=grad_h_PF[start:stop])
    # SwiGLU backward with the roundings autograd makes on GroupedExperts' bf16 tensors.
    grad_gate_PF = torch.ops.aten.silu_backward(grad_h_PF * up_PF, gate_PF)
    grad_up_PF = grad_h_PF * act_PF
    x_PD = hidden_states.index_select(0, token_P)
    grad_x_P1D = _with_zero_row(num_slots, x_PD)
    for (expert, start, stop), accumulate in zip(runs, again):
        grad_gate, grad_up = grad_gate_PF[start:stop], grad_up_PF[start:stop]
        _mm_into(grad_w1[expert], grad_gate.t(), x_PD[start:stop], accumulate)
        _mm_into(grad_w3[expert], grad_up.t(), x_PD[start:stop], accumulate)
        # Two products summed in the compute dtype, as autograd sums x's two uses in GroupedExperts.
        torch.mm(grad_gate, w1_EFD[expert], out=grad_x_P1D[start:stop]).add_(grad_up @ w3_EFD[expert])
    with_blocks = {expert for expert, _, _ in runs}
    idle = [e for e in range(num_experts) if e not in with_blocks]
    if idle:
        idle_index = torch.tensor(idle, device=w1_EFD.device)
        for grad in (grad_w1, grad_w3, grad_w2):
            grad.index_fill_(0, idle_index, 0)

    grad_hidden = _with_zero_row(num_rows - 1, x_PD)  # the padding row's gradient is zero
    grad_hidden[: num_rows - 1] = _sum_over_slots(grad_x_P1D, _token_slot_table(token_P, num_rows - 1), acc)
    return (
        grad_hidden,
        grad_affinity.to(expert_affinities_masked.dtype).view_as(expert_affinities_masked),
        grad_w1,
        grad_w3,
        grad_w2,
    )


# ---- the op ------------------------------------------------------------------------------------


@torch.library.custom_op("neuron_qwen3::blockwise_moe_experts", mutates_args=())
def _blockwise_moe_experts_op(
    hidden_states: torch.Tensor,
    expert_affinities_masked: torch.Tensor,
    w1_EFD: torch.Tensor,
    w3_EFD: torch.Tensor,
    w2_EDF: torch.Tensor,
    token_position_to_id: torch.Tensor,
    block_to_expert: torch.Tensor,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    args = (
        hidden_states, expert_affinities_masked, w1_EFD, w3_EFD, w2_EDF,
        token_position_to_id, block_to_expert, block_size,
    )
    path = kernel_path(hidden_states.device)
    _log_kernel_path(path, hidden_states.device.type)  # here, where the path is taken, compiled or not
    if path == "nki":
        return nki_kernels.moe_cte_forward(*args)
    return reference_forward(*args)


@_blockwise_moe_experts_op.register_fake
def _(hidden_states, expert_affinities_masked, w1_EFD, w3_EFD, w2_EDF, token_position_to_id, block_to_expert,
      block_size):
    num_rows, dim = hidden_states.shape
    hidden = w1_EFD.shape[1]
    num_blocks = block_to_expert.shape[0]
    return (
        hidden_states.new_empty(num_rows - 1, dim),
        hidden_states.new_empty(num_blocks, 2, hidden, block_size),
        hidden_states.new_empty(num_blocks, block_size, dim),
    )


@torch.library.custom_op("neuron_qwen3::blockwise_moe_experts_backward", mutates_args=())
def _blockwise_moe_experts_backward_op(
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
    affinity_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    args = (
        grad_output, hidden_states, expert_affinities_masked, w1_EFD, w3_EFD, w2_EDF,
        gate_up_act_T, down_act, token_position_to_id, block_to_expert, block_size,
    )
    if kernel_path(hidden_states.device) == "nki":
        return nki_kernels.blockwise_mm_backward(*args)  # the kernel computes every gradient
    return reference_backward(*args, affinity_grad=affinity_grad)


@_blockwise_moe_experts_backward_op.register_fake
def _(grad_output, hidden_states, expert_affinities_masked, w1_EFD, w3_EFD, w2_EDF, gate_up_act_T, down_act,
      token_position_to_id, block_to_expert, block_size, affinity_grad):
    return tuple(torch.empty_like(t) for t in (hidden_states, expert_affinities_masked, w1_EFD, w3_EFD, w2_EDF))


def _setup_context(ctx, inputs, output) -> None:
    *tensors, token_position_to_id, block_to_expert, block_size = inputs  # hidden, affinities, w1, w3, w2
    _, gate_up_act_T, down_act = output
    ctx.save_for_backward(*tensors, gate_up_act_T, down_act, token_position_to_id, block_to_expert)
    ctx.block_size = block_size
    ctx.mark_non_differentiable(gate_up_act_T, down_act)


def _backward(ctx, grad_out, _grad_gate_up_act_T, _grad_down_act):
    grads = _blockwise_moe_experts_backward_op(
        grad_out.contiguous(), *ctx.saved_tensors, ctx.block_size, ctx.needs_input_grad[1]
    )
    return (*grads, None, None, None)


_blockwise_moe_experts_op.register_autograd(_backward, setup_context=_setup_context)


def blockwise_moe_experts(
    hidden_states: torch.Tensor,
    expert_affinities_masked: torch.Tensor,
    w1_EFD: torch.Tensor,
    w3_EFD: torch.Tensor,
    w2_EDF: torch.Tensor,
    token_position_to_id: torch.Tensor,
    block_to_expert: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """The experts' combined output [T, H] (see the module docstring); differentiable."""
    out, _, _ = _blockwise_moe_experts_op(
        hidden_states, expert_affinities_masked, w1_EFD, w3_EFD, w2_EDF,
        token_position_to_id, block_to_expert, block_size,
    )
    return out


def layout_unit_affinities(layout: BlockLayout, num_experts: int, dtype: torch.dtype) -> torch.Tensor:
    """expert_affinities_masked [(T+1)*E, 1] with 1 for every (token, expert) slot of the layout.

    For experts whose routing weights are applied elsewhere (torchtitan's combine): the
    kernel's post-scaling becomes the identity. The padding row T stays zero.
    """
    num_tokens, block_size = layout.num_tokens, layout.block_size
    token_P, index_P = _slot_indices(layout.token_position_to_id, layout.block_to_expert, block_size, num_experts)
    flat = torch.zeros((num_tokens + 1) * num_experts, dtype=dtype, device=token_P.device)
    flat.index_put_((index_P,), (token_P != num_tokens).to(dtype))
    return flat.unsqueeze(1)


# ---- the torchtitan module and its override ----------------------------------------------------


class NKIGroupedExperts(GroupedExperts):
    """torchtitan's GroupedExperts computed by the blockwise op: same parameters, same math.

    Parameters stay `w1_EFD` / `w2_EDF` / `w3_EFD` with torchtitan's shapes (checkpoints and
    sharding specs move unchanged between the native and nki_moe ways) and go to the op as they
    are (cast to the compute dtype, as GroupedExperts does), so their gradients come back in
    their own layout. The `_grouped_mm` seam of GroupedExperts is not used.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        block_size: int = 128
        """Tokens per block (B). nkilib's backward kernel takes 128, 256, 512 or 1024."""
        compute_dtype: Literal["bfloat16", "float32"] = "bfloat16"
        """bfloat16 is GroupedExperts' own cast (and the kernels'); float32 is for the reference only."""
        block_count: Literal["auto", "exact", "static"] = "auto"
        """N: "exact" sum ceil(count/B) (host sync), "static" the bound max_num_blocks (fixed
        shapes for compiled graphs), "auto" static on the NKI path or under torch.compile, else exact."""

    def __init__(self, config: Config):
        super().__init__(config)
        if config.block_size < 1:
            raise ValueError(f"block_size must be positive, got {config.block_size}")
        if config.compute_dtype not in _DTYPES:
            raise ValueError(f"compute_dtype must be one of {list(_DTYPES)}, got {config.compute_dtype!r}")
        if config.block_count not in ("auto", "exact", "static"):
            raise ValueError(f"block_count must be auto, exact or static, got {config.block_count!r}")
        self.block_size = config.block_size
        self.compute_dtype = _DTYPES[config.compute_dtype]
        self.block_count = config.block_count

    def forward(self, x_RD: torch.Tensor, num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
        """Same contract as GroupedExperts.forward: rows grouped by expert in, per-row outputs out."""
        if isinstance(self.w1_EFD, DTensor):  # as GroupedExperts: local shards under EP / TP
            w1_EFD, w2_EDF, w3_EFD = self.w1_EFD.to_local(), self.w2_EDF.to_local(), self.w3_EFD.to_local()
        else:
            w1_EFD, w2_EDF, w3_EFD = self.w1_EFD, self.w2_EDF, self.w3_EFD

        num_rows, dim = x_RD.shape
        num_experts = w1_EFD.shape[0]
        static = self.block_count == "static" or (
            self.block_count == "auto" and (kernel_path(x_RD.device) == "nki" or torch.compiler.is_compiling())
        )
        num_blocks = max_num_blocks(num_rows, num_experts, self.block_size) if static else None
        layout = presorted_block_layout(num_tokens_per_expert_E, num_rows, self.block_size, num_blocks)

        dtype = self.compute_dtype
        hidden_T1H = torch.cat([x_RD.to(dtype), x_RD.new_zeros(1, dim, dtype=dtype)])
        out_RD = blockwise_moe_experts(
            hidden_T1H,
            layout_unit_affinities(layout, num_experts, dtype),
            w1_EFD.to(dtype),
            w3_EFD.to(dtype),
            w2_EDF.to(dtype),
            layout.token_position_to_id,
            layout.block_to_expert,
            self.block_size,
        )
        return out_RD.type_as(x_RD)


@override(
    target=GroupedExperts.Config,
    exact=True,
    description="Routed experts on nkilib's blockwise MoE kernels (moe_cte + blockwise_mm_bwd); "
    "PyTorch reference of the same blocked computation off Neuron.",
)
def nki_grouped_experts(cfg: GroupedExperts.Config, **settings: object) -> NKIGroupedExperts.Config:
    """Replace a stock GroupedExperts with NKIGroupedExperts (params, init and sharding kept).

    `settings` are NKIGroupedExperts.Config fields (block_size, compute_dtype, block_count),
    given as override kwargs; an unknown name raises. `exact=True`: subclasses of
    GroupedExperts.Config (GPT-OSS's experts with biases, FusedGroupedExperts) are left alone.
    """
    return derive(cfg, NKIGroupedExperts.Config, **settings)
