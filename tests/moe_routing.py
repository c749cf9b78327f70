"""Top-k routing -> the kernels' block layout and affinities: the tests' and the benchmark's way in.

Production never routes here: torchtitan's dispatcher hands NKIGroupedExperts rows already grouped by
expert (moe/layout.py: presorted_block_layout). The tests build layouts from arbitrary top-k routings
to check the layout and the op against torchtitan's LocalTokenDispatcher and RoutedExperts.
"""

import torch

from neuron_qwen3.moe.layout import BlockLayout, blocks_per_expert, build_block_layout


def num_blocks_exact(num_tokens_per_expert_E: torch.Tensor, block_size: int) -> int:
    """N = sum_e ceil(count_e / B). Synchronizes with the device (reads one number)."""
    return int(blocks_per_expert(num_tokens_per_expert_E, block_size).sum().item())


def dispatch_order(topk_expert_ids_TK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable sort of the routed pairs by expert, as torchtitan's LocalTokenDispatcher does.

    Returns (token_ids_S, expert_ids_S): for each routed pair in dispatch order, its token and
    its expert; expert_ids_S is ascending and ties keep ascending token order.
    """
    top_k = topk_expert_ids_TK.shape[-1]
    flat_ids_S = topk_expert_ids_TK.reshape(-1)
    order_S = torch.argsort(flat_ids_S, stable=True)
    return order_S // top_k, flat_ids_S[order_S]


def routing_to_block_layout(
    topk_expert_ids_TK: torch.Tensor,
    num_experts: int,
    block_size: int,
    num_blocks: int | None = None,
) -> BlockLayout:
    """Per-token top-k expert ids [T, K] -> the block layout of those T tokens."""
    num_tokens = topk_expert_ids_TK.shape[0]
    token_ids_S, expert_ids_S = dispatch_order(topk_expert_ids_TK)
    counts_E = torch.bincount(expert_ids_S, minlength=num_experts)
    return build_block_layout(token_ids_S, counts_E, num_tokens, block_size, num_blocks)


def scatter_affinities(
    token_ids_S: torch.Tensor,
    expert_ids_S: torch.Tensor,
    scores_S: torch.Tensor,
    num_tokens: int,
    num_experts: int,
) -> torch.Tensor:
    """Routing weights of (token, expert) pairs -> expert_affinities_masked [(T+1)*E, 1].

    Differentiable in `scores_S`. A (token, expert) pair must appear at most once.
    """
    index_S = token_ids_S.to(torch.int64) * num_experts + expert_ids_S.to(torch.int64)
    flat = scores_S.new_zeros((num_tokens + 1) * num_experts)
    return flat.index_put((index_S,), scores_S.reshape(-1)).unsqueeze(1)


def expert_affinities_masked(
    topk_scores_TK: torch.Tensor, topk_expert_ids_TK: torch.Tensor, num_experts: int
) -> torch.Tensor:
    """Top-k routing weights [T, K] -> expert_affinities_masked [(T+1)*E, 1] (row T all zero)."""
    num_tokens, top_k = topk_expert_ids_TK.shape
    token_ids_S = torch.arange(num_tokens, device=topk_expert_ids_TK.device).repeat_interleave(top_k)
    return scatter_affinities(
        token_ids_S, topk_expert_ids_TK.reshape(-1), topk_scores_TK.reshape(-1), num_tokens, num_experts
    )
