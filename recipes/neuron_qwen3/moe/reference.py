"""The PyTorch reference of nkilib's blocked MoE computation: moe_cte and blockwise_mm_bwd, forward and backward.

What the op runs off Neuron (and what the self-test compares the kernels against on Neuron). Same gather
through token_position_to_id, same zero padding row T, same per-block experts, same affinity post-scaling
and scatter-add as the kernels; the weights stay in torchtitan's layout (no weight-sized packing copies:
at Qwen3-30B-A3B size they cost more than the expert matmuls on CPU) and the gradients land in it.
"""

import torch
import torch.nn.functional as F

from neuron_qwen3.moe.layout import BlockLayout, ExpertWeights, slot_indices

__all__ = ["TOLERANCE", "reference_backward", "reference_forward"]

# How close the blocked computation must come to its yardstick, as max |error| / max |expected| per tensor: the
# CPU tests hold this reference to torchtitan's GroupedExperts with these, and the self-test holds the NKI
# kernels to this reference with the bfloat16 ones (measured on CPU: fp32 within 3e-7; bf16 outputs and
# weight gradients bit-identical, input gradients within 3.4e-3).
TOLERANCE = {"float32": {"output": 1e-5, "gradients": 1e-5}, "bfloat16": {"output": 1e-2, "gradients": 2e-2}}


def _block_runs(layout: BlockLayout) -> list[tuple[int, int, int]]:
    """(expert, first slot, end slot) for each run of consecutive blocks with the same expert.

    Blocks come sorted by expert, so this is one run per expert with blocks; the reference does
    one matmul per run instead of per block, which is the same arithmetic row by row.
    """
    experts, run_blocks = torch.unique_consecutive(layout.block_to_expert.reshape(-1), return_counts=True)
    runs, start = [], 0
    for expert, num in zip(experts.tolist(), run_blocks.tolist()):
        runs.append((expert, start * layout.block_size, (start + num) * layout.block_size))
        start += num
    return runs


def _repeated_runs(runs: list[tuple[int, int, int]]) -> list[bool]:
    """For each run, whether an earlier run had the same expert (only if blocks are not sorted)."""
    seen: set[int] = set()
    repeated = []
    for expert, _, _ in runs:
        repeated.append(expert in seen)
        seen.add(expert)
    return repeated


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


def _mm_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, accumulate: bool) -> None:
    if accumulate:
        out.addmm_(a, b)
    else:
        torch.mm(a, b, out=out)


def reference_forward(
    hidden_states: torch.Tensor, expert_affinities_masked: torch.Tensor, weights: ExpertWeights, layout: BlockLayout
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_cte in PyTorch: (out [T, H], gate_up_activations_T [N, 2, I, B], down_activations [N, B, H]).

    Matmuls and SwiGLU run in the dtype of the inputs (as GroupedExperts' bf16 grouped GEMMs do).
    Like nkilib's own torch reference of moe_cte, each affinity-scaled block output is rounded to
    that dtype and the sum over a token's experts accumulates in (at least) fp32.
    """
    num_rows, dim = hidden_states.shape  # T+1
    num_experts, hidden, _ = weights.shape
    num_blocks, block_size = layout.num_blocks, layout.block_size
    num_slots = num_blocks * block_size
    token_P, affinity_index_P = slot_indices(layout, num_experts)
    runs = _block_runs(layout)

    x_PD = hidden_states.index_select(0, token_P)  # gather; padding slots read the zero row T
    gate_PF = hidden_states.new_empty(num_slots, hidden)
    up_PF = hidden_states.new_empty(num_slots, hidden)
    down_PD = hidden_states.new_empty(num_slots, dim)
    for expert, start, stop in runs:
        torch.mm(x_PD[start:stop], weights.w1_EFD[expert].t(), out=gate_PF[start:stop])
        torch.mm(x_PD[start:stop], weights.w3_EFD[expert].t(), out=up_PF[start:stop])
    h_PF = F.silu(gate_PF) * up_PF  # elementwise over all slots at once; only the matmuls go per run
    for expert, start, stop in runs:
        torch.mm(h_PF[start:stop], weights.w2_EDF[expert].t(), out=down_PD[start:stop])

    affinity_P = expert_affinities_masked.reshape(-1).index_select(0, affinity_index_P)
    scaled_P1D = _with_zero_row(num_slots, down_PD)
    torch.mul(down_PD, affinity_P.unsqueeze(1), out=scaled_P1D[:num_slots])  # (promoted) product, rounded once
    table_TM = _token_slot_table(token_P, num_rows - 1)
    out_TD = _sum_over_slots(scaled_P1D, table_TM, _accumulation_dtype(hidden_states.dtype))
    gate_up_act_T = torch.stack(
        [
            gate_PF.view(num_blocks, block_size, hidden).transpose(1, 2),
            up_PF.view(num_blocks, block_size, hidden).transpose(1, 2),
        ],
        dim=1,
    )
    return out_TD.to(hidden_states.dtype), gate_up_act_T, down_PD.view(num_blocks, block_size, dim)


def reference_backward(
    grad_output: torch.Tensor,
    hidden_states: torch.Tensor,
    expert_affinities_masked: torch.Tensor,
    weights: ExpertWeights,
    checkpoints: tuple[torch.Tensor, torch.Tensor],
    layout: BlockLayout,
    affinity_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """blockwise_mm_bwd in PyTorch, from the forward's checkpoints (gate_up_activations_T, down_activations).

    Returns grads of (hidden_states [T+1, H], expert_affinities_masked [(T+1)*E, 1], w1, w3, w2),
    each in its input's dtype and layout. Experts without blocks get zero gradients. With
    `affinity_grad` False (constant affinities, as NKIGroupedExperts passes) the affinity
    gradient, a dot product per slot, is skipped and returned as zeros.
    """
    gate_up_act_T, down_act = checkpoints
    w1_EFD, w3_EFD, w2_EDF = weights.w1_EFD, weights.w3_EFD, weights.w2_EDF
    num_rows, dim = hidden_states.shape
    num_experts, hidden, _ = weights.shape
    num_slots = layout.num_blocks * layout.block_size
    acc = _accumulation_dtype(hidden_states.dtype)
    token_P, affinity_index_P = slot_indices(layout, num_experts)
    runs = _block_runs(layout)
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
