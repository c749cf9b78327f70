"""Document-causal attention with GQA in PyTorch eager ops: the maths of nkilib's training kernels (nki_kernels.py),
run wherever they cannot (CPU, CUDA, the simulated device).

Query i of batch row b attends keys j with starts[b, i] <= j <= i (masks.document_starts). Both passes walk the
queries in blocks of BLOCK, each against the keys up to the block's end, so memory grows as sequence x block, not
sequence^2; the backward recomputes each block's probabilities from the forward's log-sum-exp, as flash attention
does, so nothing of size sequence^2 is ever saved. All shapes follow from the inputs' (no data-dependent shape): a
compiler sees the same graph for every window. Scores and statistics are float32 (float64 for float64 inputs),
whatever the inputs' dtype.

Layouts: q [B, Hq, L, D]; k, v [B, Hkv, L, D] (query head h reads kv head h // (Hq // Hkv)); starts [B, L];
out [B, Hq, L, D] in q's dtype; lse [B, Hq, L] float32 (float64 for float64 inputs), the log-sum-exp of the scaled
scores over the allowed keys.
"""

import torch

BLOCK = 128  # queries per block: nkilib's tile, and small enough that a block's scores stay far under L^2


def _grouped(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[B, Hq, L, D] -> [B, Hkv, G, L, D]: the query heads that share each kv head, side by side."""
    b, h, n, d = x.shape
    assert h % kv_heads == 0, f"{h} query heads are not a multiple of {kv_heads} kv heads"
    return x.view(b, kv_heads, h // kv_heads, n, d)


def _allowed(starts: torch.Tensor, begin: int, end: int) -> torch.Tensor:
    """[B, 1, 1, end - begin, end]: may query i (of the block begin..end) attend key j (of 0..end)?"""
    query = torch.arange(begin, end, device=starts.device).view(1, -1, 1)
    key = torch.arange(end, device=starts.device).view(1, 1, -1)
    allowed = (key >= starts[:, begin:end, None].to(torch.int64)) & (key <= query)
    return allowed[:, None, None]


def _accumulator(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _scores(q_blk, k, starts, begin, end, scale):
    """The block's masked, scaled scores [B, Hkv, G, block, end], in the accumulator's dtype."""
    scores = torch.einsum("bhgqd,bhkd->bhgqk", q_blk, k[:, :, :end].to(q_blk.dtype)) * scale
    return scores.masked_fill(~_allowed(starts, begin, end), float("-inf"))


def reference_forward(q, k, v, starts, scale: float):
    """(out, lse) of document-causal attention; see the module docstring for the layouts."""
    batch, heads, length, dim = q.shape
    kv_heads = k.shape[1]
    acc = _accumulator(q)
    qg = _grouped(q, kv_heads).to(acc)
    out = torch.empty_like(qg)
    lse = torch.empty(qg.shape[:-1], device=q.device, dtype=acc)
    for begin in range(0, length, BLOCK):
        end = min(begin + BLOCK, length)
        scores = _scores(qg[..., begin:end, :], k, starts, begin, end, scale)
        block_lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - block_lse[..., None])
        out[..., begin:end, :] = torch.einsum("bhgqk,bhkd->bhgqd", probs, v[:, :, :end].to(acc))
        lse[..., begin:end] = block_lse
    return out.view(batch, heads, length, dim).to(q.dtype), lse.view(batch, heads, length)


def reference_backward(grad_out, q, k, v, out, lse, starts, scale: float):
    """(dq, dk, dv) of reference_forward, from its out and lse; each in its input's layout and dtype."""
    batch, heads, length, dim = q.shape
    kv_heads = k.shape[1]
    acc = _accumulator(q)
    qg, dog = _grouped(q, kv_heads).to(acc), _grouped(grad_out, kv_heads).to(acc)
    lse_g = lse.view(batch, kv_heads, heads // kv_heads, length).to(acc)
    delta = (dog * _grouped(out, kv_heads).to(acc)).sum(-1)  # rowsum(dO * O): softmax's backward
    dq = torch.empty_like(qg)
    dk = torch.zeros_like(k, dtype=acc)
    dv = torch.zeros_like(v, dtype=acc)
    k_acc, v_acc = k.to(acc), v.to(acc)
    for begin in range(0, length, BLOCK):
        end = min(begin + BLOCK, length)
        q_blk, do_blk = qg[..., begin:end, :], dog[..., begin:end, :]
        probs = torch.exp(_scores(q_blk, k_acc, starts, begin, end, scale) - lse_g[..., begin:end, None])
        dv[:, :, :end] += torch.einsum("bhgqk,bhgqd->bhkd", probs, do_blk)
        dprobs = torch.einsum("bhgqd,bhkd->bhgqk", do_blk, v_acc[:, :, :end])
        dscores = probs * (dprobs - delta[..., begin:end, None]) * scale
        dq[..., begin:end, :] = torch.einsum("bhgqk,bhkd->bhgqd", dscores, k_acc[:, :, :end])
        dk[:, :, :end] += torch.einsum("bhgqk,bhgqd->bhkd", dscores, q_blk)
    return dq.view(batch, heads, length, dim).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
