"""The nkilib blockwise layout built by moe/layout.py: properties over many random routings.

Run: .venv/bin/python -m pytest tests/test_moe_layout.py -q

The dispatch order is checked against torchtitan's own LocalTokenDispatcher, the block counts
against math.ceil, the static bound against brute force, and the packed weights against the
products torchtitan's GroupedExperts computes.
"""

import itertools
import math
from collections import Counter

import pytest
import torch

from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher

from moe_routing import dispatch_order, expert_affinities_masked, num_blocks_exact, routing_to_block_layout

from neuron_qwen3.moe.layout import (
    BlockLayout,
    blocks_per_expert,
    max_num_blocks,
    pack_down,
    pack_gate_up,
    presorted_block_layout,
    presorted_row_experts,
    unit_affinities,
    unpack_down,
    unpack_gate_up,
)


def random_routing(gen, num_tokens, num_experts, top_k, expert_weights=None):
    """Top-k distinct experts per token; `expert_weights` skews the choice (zeros = never chosen)."""
    weights = torch.ones(num_experts) if expert_weights is None else torch.as_tensor(expert_weights, dtype=torch.float)
    return torch.stack([torch.multinomial(weights, top_k, replacement=False, generator=gen) for _ in range(num_tokens)])


def routing_cases():
    """(name, topk_expert_ids [T, K], num_experts, block_size) covering the corners."""
    gen = torch.Generator().manual_seed(0)
    cases = []
    for seed in range(40):  # random shapes, uniform routing
        num_experts = int(torch.randint(1, 17, (), generator=gen))
        top_k = int(torch.randint(1, min(num_experts, 4) + 1, (), generator=gen))
        num_tokens = int(torch.randint(1, 40, (), generator=gen))
        block_size = int(torch.randint(1, 9, (), generator=gen))
        cases.append((f"random{seed}", random_routing(gen, num_tokens, num_experts, top_k), num_experts, block_size))
    # experts that receive no tokens: only 3 of 12 experts are ever chosen
    skew = [0, 1, 0, 0, 5, 0, 0, 0, 0, 2, 0, 0]
    for block_size in (1, 3, 4, 64):
        cases.append((f"idle_experts_b{block_size}", random_routing(gen, 17, 12, 2, skew), 12, block_size))
    # one expert receiving every token (top-1 and top-2 where expert 3 is in every pair)
    cases.append(("one_expert_top1", torch.full((23, 1), 3), 8, 4))
    second = random_routing(gen, 23, 7, 1) % 7
    second[second == 3] = 0
    cases.append(("one_expert_in_every_token", torch.cat([torch.full((23, 1), 3), second], 1), 8, 5))
    # block sizes that divide every count, and ones that divide none
    divides = torch.arange(24).remainder(4).unsqueeze(1)  # 6 tokens per expert
    cases += [("divides_b3", divides, 4, 3), ("divides_b6", divides, 4, 6), ("divides_none_b4", divides, 4, 4)]
    cases.append(("block_larger_than_all_counts", random_routing(gen, 9, 6, 2), 6, 128))
    cases.append(("single_token", torch.tensor([[2, 0]]), 3, 2))
    return cases


CASES = routing_cases()


@pytest.mark.parametrize("name, ids, num_experts, block_size", CASES, ids=[c[0] for c in CASES])
def test_layout_properties(name, ids, num_experts, block_size):
    num_tokens, top_k = ids.shape
    layout = routing_to_block_layout(ids, num_experts, block_size)
    tp2id = layout.token_position_to_id.tolist()
    block_expert = layout.block_to_expert.reshape(-1).tolist()
    counts = Counter(ids.reshape(-1).tolist())

    # sizes and dtypes the kernels take
    expected_blocks = {e: math.ceil(counts[e] / block_size) for e in range(num_experts)}
    assert layout.num_blocks == sum(expected_blocks.values())
    assert layout.block_to_expert.shape == (layout.num_blocks, 1)
    assert len(tp2id) == layout.num_blocks * block_size
    assert layout.token_position_to_id.dtype == layout.block_to_expert.dtype == torch.int32

    # block_to_expert: ascending, ceil(count_e / B) blocks per expert, none for idle experts
    assert block_expert == sorted(block_expert)
    assert Counter(block_expert) == Counter({e: n for e, n in expected_blocks.items() if n})

    # every routed (token, expert) pair exactly once; every other slot is padding (row T)
    slot_pairs = [(t, block_expert[p // block_size]) for p, t in enumerate(tp2id) if t != num_tokens]
    routed_pairs = [(t, e) for t in range(num_tokens) for e in ids[t].tolist()]
    assert Counter(slot_pairs) == Counter(routed_pairs)
    assert tp2id.count(num_tokens) == len(tp2id) - num_tokens * top_k
    assert all(0 <= t <= num_tokens for t in tp2id)

    # each expert's pairs fill its blocks front first, padding only at the end of its last block
    for expert in range(num_experts):
        slots = [tp2id[p] for p in range(len(tp2id)) if block_expert[p // block_size] == expert]
        used = counts[expert]
        assert slots[:used] == sorted(slots[:used]) and num_tokens not in slots[:used]
        assert set(slots[used:]) <= {num_tokens}


@pytest.mark.parametrize("name, ids, num_experts, block_size", CASES[::5], ids=[c[0] for c in CASES[::5]])
def test_dispatch_order_is_torchtitans(name, ids, num_experts, block_size):
    """Non-padding slots, read in order, are exactly torchtitan's expert-sorted token order."""
    num_tokens, top_k = ids.shape
    dispatcher = LocalTokenDispatcher(LocalTokenDispatcher.Config(num_experts=num_experts, top_k=top_k))
    x = torch.arange(num_tokens, dtype=torch.float).unsqueeze(1)
    _, titan_tokens, _ = dispatcher._local_reorder(x, torch.rand(num_tokens, top_k), ids)
    layout = routing_to_block_layout(ids, num_experts, block_size)
    slots = layout.token_position_to_id[layout.token_position_to_id != num_tokens]
    assert torch.equal(slots.long(), titan_tokens)
    tokens, experts = dispatch_order(ids)
    assert torch.equal(tokens, titan_tokens)
    assert torch.equal(experts, ids.reshape(-1).sort(stable=True).values)


def test_static_block_count_pads_with_empty_blocks():
    gen = torch.Generator().manual_seed(1)
    for num_tokens, num_experts, top_k, block_size in [(13, 5, 2, 3), (40, 8, 4, 4), (3, 9, 2, 2), (20, 1, 1, 7)]:
        ids = random_routing(gen, num_tokens, num_experts, top_k)
        exact = routing_to_block_layout(ids, num_experts, block_size)
        bound = max_num_blocks(num_tokens * top_k, num_experts, block_size)
        static = routing_to_block_layout(ids, num_experts, block_size, num_blocks=bound)
        n, b = exact.num_blocks, block_size
        assert static.num_blocks == bound >= n
        assert torch.equal(static.token_position_to_id[: n * b], exact.token_position_to_id)
        assert torch.equal(static.block_to_expert[:n], exact.block_to_expert)
        assert (static.token_position_to_id[n * b :] == num_tokens).all()
        assert (static.block_to_expert[n:] == num_experts - 1).all()
    with pytest.raises(ValueError, match="too small"):
        routing_to_block_layout(torch.zeros(10, 1, dtype=torch.long), 2, 4, num_blocks=2)


def test_max_num_blocks_is_the_tight_bound():
    """Brute force over every way to split S routed pairs among E experts."""
    for num_routed, num_experts, block_size in itertools.product(range(0, 9), range(1, 5), range(1, 5)):
        worst = max(
            (
                sum(math.ceil(c / block_size) for c in split)
                for split in itertools.product(range(num_routed + 1), repeat=num_experts)
                if sum(split) == num_routed
            ),
            default=0,
        )
        assert max_num_blocks(num_routed, num_experts, block_size) == worst, (num_routed, num_experts, block_size)


def test_block_counts_helpers():
    counts = torch.tensor([0, 1, 4, 5, 8, 9])
    assert blocks_per_expert(counts, 4).tolist() == [0, 1, 1, 2, 2, 3]
    assert num_blocks_exact(counts, 4) == 9
    with pytest.raises(ValueError):
        blocks_per_expert(counts, 0)


def test_presorted_layout_for_grouped_rows():
    """GroupedExperts' input: rows already grouped by expert; rows past sum(counts) get no slot."""
    counts = torch.tensor([3, 0, 5, 1])
    layout = presorted_block_layout(counts, num_rows=11, block_size=2)  # 9 routed rows + 2 spare
    assert layout.block_to_expert.reshape(-1).tolist() == [0, 0, 2, 2, 2, 3]
    pad = 11
    assert layout.token_position_to_id.tolist() == [0, 1, 2, pad, 3, 4, 5, 6, 7, pad, 8, pad]
    static = presorted_block_layout(counts, 11, 2, num_blocks=max_num_blocks(11, 4, 2))
    assert static.token_position_to_id[:12].tolist() == layout.token_position_to_id.tolist()


def test_affinities_masked():
    gen = torch.Generator().manual_seed(2)
    num_tokens, num_experts, top_k = 9, 6, 3
    ids = random_routing(gen, num_tokens, num_experts, top_k)
    scores = torch.rand(num_tokens, top_k, generator=gen, requires_grad=True)
    aff = expert_affinities_masked(scores, ids, num_experts)
    assert aff.shape == ((num_tokens + 1) * num_experts, 1)
    dense = aff.view(num_tokens + 1, num_experts)
    expected = torch.zeros(num_tokens + 1, num_experts).scatter(1, ids, scores.detach())
    assert torch.equal(dense.detach(), expected)  # row T (padding) all zero
    assert int((dense != 0).sum()) == num_tokens * top_k
    (aff.squeeze(1) * torch.arange(aff.shape[0])).sum().backward()  # gradient reaches the scores
    assert torch.equal(scores.grad, (torch.arange(num_tokens).unsqueeze(1) * num_experts + ids).float())


def test_weight_packing_round_trips_and_matches_grouped_experts_products():
    gen = torch.Generator().manual_seed(3)
    for num_experts, dim, hidden in [(1, 4, 3), (5, 16, 8), (3, 7, 11)]:
        w1 = torch.randn(num_experts, hidden, dim, generator=gen)  # torchtitan w1_EFD (gate)
        w3 = torch.randn(num_experts, hidden, dim, generator=gen)  # w3_EFD (up)
        w2 = torch.randn(num_experts, dim, hidden, generator=gen)  # w2_EDF (down)
        gate_up, down = pack_gate_up(w1, w3), pack_down(w2)
        assert gate_up.shape == (num_experts, dim, 2, hidden) and gate_up.is_contiguous()
        assert down.shape == (num_experts, hidden, dim) and down.is_contiguous()
        w1_back, w3_back = unpack_gate_up(gate_up)
        assert torch.equal(w1_back, w1) and torch.equal(w3_back, w3) and torch.equal(unpack_down(down), w2)
        x = torch.randn(4, dim, generator=gen, dtype=torch.float64)
        for e in range(num_experts):  # the kernel's products are GroupedExperts' products
            assert torch.allclose(x @ gate_up[e, :, 0].double(), x @ w1[e].double().T)
            assert torch.allclose(x @ gate_up[e, :, 1].double(), x @ w3[e].double().T)
            h = torch.randn(4, hidden, generator=gen, dtype=torch.float64)
            assert torch.allclose(h @ down[e].double(), h @ w2[e].double().T)
    with pytest.raises(ValueError):
        pack_gate_up(torch.zeros(2, 3, 4), torch.zeros(2, 4, 3))


def test_packing_sends_gradients_back_in_torchtitan_layout():
    w1, w3, w2 = (
        torch.randn(3, 5, 4, requires_grad=True),
        torch.randn(3, 5, 4, requires_grad=True),
        torch.randn(3, 4, 5, requires_grad=True),
    )
    grad_gate_up, grad_down = torch.randn(3, 4, 2, 5), torch.randn(3, 5, 4)
    torch.autograd.backward([pack_gate_up(w1, w3), pack_down(w2)], [grad_gate_up, grad_down])
    g1, g3 = unpack_gate_up(grad_gate_up)
    assert torch.equal(w1.grad, g1) and torch.equal(w3.grad, g3) and torch.equal(w2.grad, unpack_down(grad_down))


def test_unit_affinities_mark_every_routed_slot_and_nothing_else():
    counts = torch.tensor([3, 0, 2])
    layout = presorted_block_layout(
        counts, num_rows=6, block_size=2
    )  # rows 0-2 expert 0, rows 3-4 expert 2, row 5 none
    dense = unit_affinities(layout, 3, torch.float32).view(7, 3)
    expected = torch.zeros(7, 3)
    expected[[0, 1, 2], 0] = 1
    expected[[3, 4], 2] = 1
    assert torch.equal(dense, expected)  # the spare row 5 and the padding row 6 stay zero
    assert isinstance(layout, BlockLayout) and layout.num_tokens == 6


def test_each_rows_expert_and_the_rows_of_none():
    counts = torch.tensor([2, 0, 3, 1])
    assert presorted_row_experts(counts, 8).tolist() == [0, 0, 2, 2, 2, 3, 4, 4]  # rows past the counts: E
