"""The nkilib blockwise MoE layout, in plain torch: rows grouped by expert -> blocks, affinities, weight packing.

The block layout is shared by both paths of `experts.py` (NKI kernels, PyTorch reference); the
weight packing is the NKI seam's (nki_kernels.py). No Neuron imports. Building a layout from top-k
routing (rather than from torchtitan's already-grouped rows) is test-only: tests/moe_routing.py.

Shape letters (torchtitan's suffix legend, plus the kernel's names):
    T tokens (rows of the hidden states; row T is the zero padding row), K top-k,
    S = number of routed (token, expert) pairs (T*K for top-k routing),
    E experts, B block size, N blocks, P = N*B block slots,
    D = H model dim (torchtitan says D, nkilib says H), F = I expert hidden dim.

The layout (nkilib `moe_cte` / `blockwise_mm_bwd`, dropless):
    * dispatch order: the routed pairs stably sorted by expert (torchtitan's
      `torch.argsort(ids, stable=True)`), so within an expert tokens keep ascending order;
    * expert e owns ceil(count_e / B) consecutive blocks; experts with no tokens own none;
    * `block_to_expert` [N, 1] int32: the expert of each block, ascending;
    * `token_position_to_id` [N*B] int32: the token id in each block slot; unused slots
      point at T, the zero padding row of `hidden_states` [T+1, H];
    * `expert_affinities_masked` [(T+1)*E, 1]: the routing weight of (token t, expert e) at
      row t*E + e, zero elsewhere and on the whole padding row T.

How N is sized:
    * exact (`num_blocks=None`): N = sum_e ceil(count_e / B). Needs the counts on the host (one
      `.item()` sync); fine in eager mode and for the CPU reference.
    * static: `max_num_blocks(S, E, B)`, the largest N any routing of S pairs over E experts
      can need (E + (S - E) // B when S >= E, else S; the same bound nkilib's tests use).
      Shapes then depend only on S, E and B, as a compiled graph (torch.compile on Neuron,
      where dynamic shapes are unsupported) needs. The surplus blocks are padding blocks:
      every slot points at T and their expert is E-1 (nkilib's convention), so they
      contribute exactly zero.
"""

from dataclasses import dataclass

import torch

__all__ = [
    "BlockLayout",
    "ExpertWeights",
    "blocks_per_expert",
    "build_block_layout",
    "max_num_blocks",
    "pack_down",
    "pack_gate_up",
    "presorted_block_layout",
    "slot_indices",
    "unit_affinities",
    "unpack_down",
    "unpack_gate_up",
]

INDEX_DTYPE = torch.int32  # what the kernels take for token_position_to_id and block_to_expert


@dataclass(frozen=True)
class BlockLayout:
    """Block metadata for one routing, in the kernel's layout."""

    token_position_to_id: torch.Tensor  # [N*B] int32, padding slots = num_tokens
    block_to_expert: torch.Tensor  # [N, 1] int32, ascending
    num_tokens: int  # T: the padding row index
    block_size: int  # B

    @property
    def num_blocks(self) -> int:
        return self.block_to_expert.shape[0]


@dataclass(frozen=True)
class ExpertWeights:
    """The experts' weights in torchtitan's layout (GroupedExperts): what the op, the reference and the kernels take."""

    w1_EFD: torch.Tensor  # gate [E, F, D]
    w3_EFD: torch.Tensor  # up [E, F, D]
    w2_EDF: torch.Tensor  # down [E, D, F]

    @property
    def shape(self) -> tuple[int, int, int]:
        """(E, F, D) = (experts, expert hidden dim I, model dim H)."""
        num_experts, hidden, dim = self.w1_EFD.shape
        return num_experts, hidden, dim


# ---- block counts ------------------------------------------------------------------------------


def blocks_per_expert(num_tokens_per_expert_E: torch.Tensor, block_size: int) -> torch.Tensor:
    """ceil(count_e / B) for every expert (0 for an expert with no tokens)."""
    _check_block_size(block_size)
    return torch.div(num_tokens_per_expert_E + (block_size - 1), block_size, rounding_mode="floor")


def max_num_blocks(num_routed: int, num_experts: int, block_size: int) -> int:
    """Static upper bound on N over every routing of `num_routed` pairs to `num_experts` experts.

    With m experts in use, N = sum ceil(c_e/B) <= m + (S - m) // B, which grows with m; so the
    maximum is at m = min(E, S): E + (S - E) // B (or S when there are fewer pairs than experts).
    """
    _check_block_size(block_size)
    if num_routed <= 0:
        return 0
    if num_routed < num_experts:
        return num_routed
    return num_experts + (num_routed - num_experts) // block_size


# ---- the layout ------------------------------------------------------------------------------


def build_block_layout(
    token_ids_S: torch.Tensor,
    num_tokens_per_expert_E: torch.Tensor,
    num_tokens: int,
    block_size: int,
    num_blocks: int | None = None,
) -> BlockLayout:
    """The block layout for pairs already in dispatch order (grouped by ascending expert).

    Args:
        token_ids_S: the token id of each routed pair, in dispatch order. Pairs past
            sum(num_tokens_per_expert_E) are unrouted (e.g. capacity padding rows) and get no slot.
        num_tokens_per_expert_E: how many pairs each expert received.
        num_tokens: T; padding slots point at row T.
        block_size: B.
        num_blocks: N; None for the exact count (one host sync), or a static N that is at
            least the exact count (e.g. `max_num_blocks`). Surplus blocks are padding blocks.
    """
    _check_block_size(block_size)
    device = token_ids_S.device
    num_experts = num_tokens_per_expert_E.shape[0]
    num_pairs = token_ids_S.shape[0]
    counts_E = num_tokens_per_expert_E.to(device=device, dtype=torch.int64)
    blocks_E = blocks_per_expert(counts_E, block_size)
    if num_blocks is None:
        num_blocks = int(blocks_E.sum().item())
    elif not torch.compiler.is_compiling() and int(blocks_E.sum()) > num_blocks:
        raise ValueError(
            f"num_blocks={num_blocks} is too small for this routing: it needs {int(blocks_E.sum())} "
            f"blocks of {block_size} (max_num_blocks() gives a static bound)"
        )
    num_slots = num_blocks * block_size

    # Expert of each block: how many experts' blocks end at or before it. Blocks past the
    # last expert's (static padding blocks) clamp to expert E-1.
    block_end_E = torch.cumsum(blocks_E, dim=0)
    block_ids_N = torch.arange(num_blocks, device=device, dtype=torch.int64)
    block_to_expert_N = torch.searchsorted(block_end_E, block_ids_N, right=True).clamp_(max=num_experts - 1)

    # Slot of each pair: its expert's first slot plus its rank among the expert's pairs.
    # Searchsorted instead of repeat_interleave keeps every shape static; unrouted pairs
    # (expert id E) go to a scratch slot past the end that is dropped.
    pair_end_E = torch.cumsum(counts_E, dim=0)
    pair_ids_S = torch.arange(num_pairs, device=device, dtype=torch.int64)
    expert_ids_S = torch.searchsorted(pair_end_E, pair_ids_S, right=True)
    routed_S = expert_ids_S < num_experts
    expert_ids_S = expert_ids_S.clamp_(max=num_experts - 1)
    rank_S = pair_ids_S - (pair_end_E - counts_E)[expert_ids_S]
    first_slot_E = (block_end_E - blocks_E) * block_size
    slot_S = torch.where(routed_S, first_slot_E[expert_ids_S] + rank_S, num_slots)

    token_position_to_id_P = torch.full((num_slots + 1,), num_tokens, device=device, dtype=INDEX_DTYPE)
    token_position_to_id_P[slot_S] = token_ids_S.to(INDEX_DTYPE)
    return BlockLayout(
        token_position_to_id=token_position_to_id_P[:num_slots],
        block_to_expert=block_to_expert_N.to(INDEX_DTYPE).unsqueeze(1),
        num_tokens=num_tokens,
        block_size=block_size,
    )


def presorted_block_layout(
    num_tokens_per_expert_E: torch.Tensor,
    num_rows: int,
    block_size: int,
    num_blocks: int | None = None,
) -> BlockLayout:
    """The layout for rows already grouped by expert (torchtitan's GroupedExperts input).

    Row r is "token" r: expert 0 owns rows [0, c_0), expert 1 the next c_1 rows, and so on.
    Rows past sum(counts) (capacity padding under some EP dispatchers) are in no block, so
    their output is zero.
    """
    row_ids_S = torch.arange(num_rows, device=num_tokens_per_expert_E.device)
    return build_block_layout(row_ids_S, num_tokens_per_expert_E, num_rows, block_size, num_blocks)


def presorted_row_experts(num_tokens_per_expert_E: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Each row's expert [R] for rows grouped by expert, as presorted_block_layout reads them; E (no expert) for
    the rows past sum(counts). A static shape: searchsorted, no host sync."""
    end_E = torch.cumsum(num_tokens_per_expert_E, 0)
    return torch.searchsorted(end_E, torch.arange(num_rows, device=end_E.device, dtype=end_E.dtype), right=True)


# ---- affinities --------------------------------------------------------------------------------


def slot_indices(layout: BlockLayout, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block slot: the token row it reads, and the flat index of its affinity (token*E + expert)."""
    token_P = layout.token_position_to_id.to(torch.int64)
    expert_P = layout.block_to_expert.reshape(-1).to(torch.int64).repeat_interleave(layout.block_size)
    return token_P, token_P * num_experts + expert_P


def unit_affinities(layout: BlockLayout, num_experts: int, dtype: torch.dtype) -> torch.Tensor:
    """expert_affinities_masked [(T+1)*E, 1] with 1 for every (token, expert) slot of the layout.

    For experts whose routing weights are applied elsewhere (torchtitan's combine): the
    kernel's post-scaling becomes the identity. The padding row T stays zero.
    """
    token_P, index_P = slot_indices(layout, num_experts)
    flat = torch.zeros((layout.num_tokens + 1) * num_experts, dtype=dtype, device=token_P.device)
    flat.index_put_((index_P,), (token_P != layout.num_tokens).to(dtype))
    return flat.unsqueeze(1)


# ---- weight packing ----------------------------------------------------------------------------
# torchtitan GroupedExperts: w1_EFD [E, F, D] (gate), w3_EFD [E, F, D] (up), w2_EDF [E, D, F] (down);
# the expert computes silu(x @ w1[e].T) * (x @ w3[e].T) @ w2[e].T.
# nkilib: gate_up_proj_weight [E, H, 2, I] with [..., 0, :] the gate and [..., 1, :] the up,
# down_proj_weight [E, I, H]; the expert computes silu(x @ gu[e,:,0]) * (x @ gu[e,:,1]) @ down[e].
# All four functions are differentiable (stack / transpose / copy), so packing inside a forward
# sends the gradients back to torchtitan's parameters.


def pack_gate_up(w1_EFD: torch.Tensor, w3_EFD: torch.Tensor) -> torch.Tensor:
    """w1 (gate) [E, F, D] and w3 (up) [E, F, D] -> gate_up_proj_weight [E, D, 2, F] (contiguous)."""
    if w1_EFD.shape != w3_EFD.shape:
        raise ValueError(f"w1 {tuple(w1_EFD.shape)} and w3 {tuple(w3_EFD.shape)} differ in shape")
    return torch.stack((w1_EFD.transpose(1, 2), w3_EFD.transpose(1, 2)), dim=2)


def unpack_gate_up(gate_up_EH2I: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gate_up_proj_weight [E, D, 2, F] -> (w1 [E, F, D], w3 [E, F, D]), contiguous."""
    gate_EHI, up_EHI = gate_up_EH2I.unbind(dim=2)
    return gate_EHI.transpose(1, 2).contiguous(), up_EHI.transpose(1, 2).contiguous()


def pack_down(w2_EDF: torch.Tensor) -> torch.Tensor:
    """w2 (down) [E, D, F] -> down_proj_weight [E, F, D] (contiguous)."""
    return w2_EDF.transpose(1, 2).contiguous()


def unpack_down(down_EIH: torch.Tensor) -> torch.Tensor:
    """down_proj_weight [E, F, D] -> w2 [E, D, F] (contiguous)."""
    return down_EIH.transpose(1, 2).contiguous()


def _check_block_size(block_size: int) -> None:
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
