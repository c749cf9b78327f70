"""The Neuron seam of document-causal attention: nkilib's training attention kernels as torch ops on TorchNeuron,
and their shape limits.

The only module of attention/ that touches `torch_neuronx`, `nki` (through neuron_sdk.py) or `nkilib`, and only
inside functions: importing it is free anywhere. document.py calls `attention_forward` and `attention_backward` on a
`neuron` device (or when the kernel is forced to nki); off Neuron they raise ImportError naming the missing package.
Layouts as in reference.py: q [B, Hq, L, D], k/v [B, Hkv, L, D], doc_start [B, L] int32; out [B, Hq, L, D], lse [B,
Hq, L] fp32.

    forward:  nkilib.core.attention.attention_cte.attention_cte, causal_mask=True, cache_softmax=True,
              tp_q=True (q [Hq, L, D]), tp_k=False (k [Hkv, D, L]), tp_out=False (out [Hq, L, D]),
              bound_min/bound_max [L, 1] fp32, scale=1.0 on q * scale -> (out, neg_max, sum_recip), the two
              statistics [Hq, 128, L/128] with query g*128 + p at [p, g].
    backward: nkilib.core.attention.attention_bwd.attention_bwd, use_causal_mask=True, mixed_precision=True,
              softmax_scale=scale, everything d-major ([1, H, D, L]), lse_ref [1, Hq, 128, L/128],
              bound_min/bound_max [L] fp32 -> (dq, dk, dv) d-major.

How the interface maps onto them:
  * bounds: bound_min = doc_start; bound_max = the end (exclusive) of the query's document, with the kernels'
    causal mask on. That is the form both kernels document and test (bounds expanded from cu_seqlens); each clamps
    it to the causal bound itself (the forward attends j <= min(i, bound_max), the backward min(bound_max, i + 1)),
    so the mask is doc_start[i] <= j <= i, and causal_mask keeps the tile skipping above the diagonal that the
    bounds alone would not give. Documents are contiguous and doc_start non-decreasing, so the end of query i's
    document is the count of tokens whose start is <= i: one searchsorted (packing_bounds).
  * batch: both kernels take one set of bounds for their whole batch, and ours differ per row, so the seam calls
    each kernel once per batch row.
  * GQA: native in both. The forward's batch is one row's heads (Hq queries over Hkv keys/values; query batch h
    reads kv h // (Hq / Hkv), as ours); the backward takes nheads and nheads_kv and sums the groups' dk, dv.
  * scale: attention_cte's packing path (range_select) asserts scale == 1.0, so q is scaled before the call, in
    q's dtype (one rounding); attention_bwd takes the true softmax_scale and unscaled q, so dq is q's gradient.
  * statistics: lse = -(neg_max + log(sum_recip)), the log-sum-exp of the scaled scores (as nkilib's own backward
    reference derives it), untiled to [Hq, L]; the backward gets it tiled back as lse_ref.
  * dtypes: attention_bwd wants q, k, v, o, dy in one dtype; all go in q's, the gradients come back in k's, v's.
  * registration: `@nki_op("neuron_qwen3_nki::<kernel>_lnc<LNC>", mutates_args={})` on a typed function calling
    `wrap_nki(kernel)[lnc](**flat kwargs)` (as moe/nki_kernels.py); the LNC is in the name, each op being built
    for one.

Read at nki-library tag 2.29 (the kernels, their *_torch.py references and integration tests: signatures, layouts,
bounds semantics, the limits in KERNEL_LIMITS); nothing here has run on a Trainium (the self-test, `--self-test`,
is the first check there). UNCONFIRMED until then:
  * attention_cte's packing path with cache_softmax=True: nkilib tests each, never the two together;
  * head_dim 32 (the smoke model) in attention_bwd, whose tests use 64 to 256;
  * that wrap_nki takes the two @nki.jit kernels directly, keyword arguments and all, and returns their tuples;
  * torch.searchsorted (packing_bounds) on a `neuron` device.
"""

import functools

import torch

from neuron_qwen3 import neuron_sdk

__all__ = ["KERNEL_LIMITS", "attention_backward", "attention_forward", "check_kernel_shapes", "packing_bounds"]

TILE = 128  # nkilib's query tile: the softmax statistics come as [heads, TILE, L / TILE]
MAX_HEAD_DIM = 128
MAX_SEQ_LEN = 131072
BWD_KEY_TILE = 512  # attention_bwd's key tile, min(512, L): L must divide into it, and it into its 8192-key sections


def _equal_head_tiles(head_dim: int) -> bool:
    """attention_bwd splits the head dim into ceil(D / 128) equal tiles."""
    tiles = -(-head_dim // TILE)
    return head_dim % -(-head_dim // tiles) == 0


# Every limit of both kernels (nki-library tag 2.29), as (what it says, test on (head_dim, seq_len, LNC)).
# attention_cte: its entry checks and _check_input_and_return_shape; the LNC from its sharding (batch over two
# cores, a remainder split between shard ids 0 and 1). attention_bwd: validate_inputs and setup_config.
KERNEL_LIMITS = (
    (f"attention_cte: head_dim at most {MAX_HEAD_DIM}", lambda d, n, lnc: d <= MAX_HEAD_DIM),
    (f"attention_cte: sequence length at most {MAX_SEQ_LEN}", lambda d, n, lnc: n <= MAX_SEQ_LEN),
    (
        f"attention_cte: sequence length a multiple of {TILE} (the softmax statistics the backward reads)",
        lambda d, n, lnc: n % TILE == 0,
    ),
    ("attention_cte: LNC 1 or 2", lambda d, n, lnc: lnc in (1, 2)),
    (
        f"attention_bwd: sequence length a multiple of {BWD_KEY_TILE}, or 128 or 256 (its key tiles)",
        lambda d, n, lnc: n % BWD_KEY_TILE == 0 or n in (128, 256),
    ),
    (
        f"attention_bwd: head_dim in equal tiles of at most {TILE}",
        lambda d, n, lnc: _equal_head_tiles(d),
    ),
)


def check_kernel_shapes(head_dim: int, seq_len: int, lnc: int) -> None:
    """Raise ValueError, one line naming each limit broken and the values, on shapes the kernels reject."""
    broken = [text for text, holds in KERNEL_LIMITS if not holds(head_dim, seq_len, lnc)]
    if broken:
        raise ValueError(
            f"nki attention kernels cannot take head_dim={head_dim}, seq_len={seq_len}, LNC={lnc}: needs "
            + "; ".join(broken)
            + ". Set NEURON_QWEN3_ATTENTION_KERNEL=reference to run the PyTorch reference instead"
        )


SEAM = neuron_sdk.Seam("nki attention kernel path", "attention runs", "NEURON_QWEN3_ATTENTION_KERNEL")


@functools.cache
def _kernel_ops(lnc: int):
    """Import the Neuron packages and register the two kernels as torch ops (once per process and LNC)."""
    nki_op, wrap_nki, _ = SEAM.torch_neuronx_and_nki()  # nki named before nkilib, for a clear error
    try:
        from nkilib.core.attention.attention_bwd import attention_bwd
        from nkilib.core.attention.attention_cte import attention_cte
    except ImportError as e:
        raise SEAM.missing("nkilib", "neuronx-cc, which bundles nkilib", e) from e

    @nki_op(f"neuron_qwen3_nki::attention_cte_lnc{lnc}", mutates_args={})
    def attention_cte_op(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bound_min: torch.Tensor, bound_max: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return wrap_nki(attention_cte)[lnc](
            q=q,
            k=k,
            v=v,
            scale=1.0,
            causal_mask=True,
            tp_q=True,
            tp_k=False,
            tp_out=False,
            cache_softmax=True,
            bound_min=bound_min,
            bound_max=bound_max,
        )

    @nki_op(f"neuron_qwen3_nki::attention_bwd_lnc{lnc}", mutates_args={})
    def attention_bwd_op(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        dy: torch.Tensor,
        lse: torch.Tensor,
        bound_min: torch.Tensor,
        bound_max: torch.Tensor,
        softmax_scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return wrap_nki(attention_bwd)[lnc](
            q_ref=q,
            k_ref=k,
            v_ref=v,
            o_ref=o,
            dy_ref=dy,
            lse_ref=lse,
            bound_min=bound_min,
            bound_max=bound_max,
            use_causal_mask=True,
            mixed_precision=True,
            softmax_scale=softmax_scale,
        )

    return attention_cte_op, attention_bwd_op


def packing_bounds(doc_start_L: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One row's [L] document starts -> (bound_min, bound_max) [L] fp32: the first key of each query's document,
    and its end (exclusive), i.e. the count of tokens whose document starts at or before the query."""
    starts = doc_start_L.contiguous()
    positions = torch.arange(starts.shape[0], device=starts.device, dtype=starts.dtype)
    ends = torch.searchsorted(starts, positions, right=True)
    return starts.to(torch.float32), ends.to(torch.float32)


def _lse_of(neg_max: torch.Tensor, sum_recip: torch.Tensor) -> torch.Tensor:
    """attention_cte's statistics [H, 128, L/128] -> lse [H, L] fp32."""
    lse = -(neg_max.float() + torch.log(sum_recip.float()))
    return lse.transpose(1, 2).reshape(lse.shape[0], -1)


def _tiled(lse_HL: torch.Tensor) -> torch.Tensor:
    """lse [H, L] -> attention_bwd's lse_ref [1, H, 128, L/128] fp32, query g*128 + p at [p, g]."""
    heads, length = lse_HL.shape
    return lse_HL.float().reshape(heads, length // TILE, TILE).transpose(1, 2).contiguous().unsqueeze(0)


def _d_major(x: torch.Tensor) -> torch.Tensor:
    """[..., L, D] -> [..., D, L], contiguous: attention_bwd's layout of every tensor."""
    return x.transpose(-1, -2).contiguous()


def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc_start: torch.Tensor, scale: float, lnc: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """attention_cte, one call per batch row: (out [B, Hq, L, D] in q's dtype, lse [B, Hq, L] fp32)."""
    attention_cte_op, _ = _kernel_ops(lnc)
    batch, _, length, head_dim = q.shape
    check_kernel_shapes(head_dim, length, lnc)
    q_scaled = q * scale  # the packing path takes scale 1.0 only
    outs, lses = [], []
    for b in range(batch):
        bound_min, bound_max = packing_bounds(doc_start[b])
        out, neg_max, sum_recip = attention_cte_op(
            q_scaled[b].contiguous(),
            _d_major(k[b].to(q.dtype)),
            v[b].to(q.dtype).contiguous(),
            bound_min.unsqueeze(1),
            bound_max.unsqueeze(1),
        )
        outs.append(out)
        lses.append(_lse_of(neg_max, sum_recip))
    return torch.stack(outs), torch.stack(lses)


def attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    doc_start: torch.Tensor,
    scale: float,
    lnc: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """attention_bwd, one call per batch row: (dq, dk, dv) in q's, k's and v's layouts and dtypes."""
    _, attention_bwd_op = _kernel_ops(lnc)
    batch, _, length, head_dim = q.shape
    check_kernel_shapes(head_dim, length, lnc)
    grads = []
    for b in range(batch):
        bound_min, bound_max = packing_bounds(doc_start[b])
        rows = (_d_major(x[b : b + 1].to(q.dtype)) for x in (q, k, v, out, grad_out))
        grads.append(attention_bwd_op(*rows, _tiled(lse[b]), bound_min, bound_max, scale))
    dq, dk, dv = (_d_major(torch.cat(g)).to(x.dtype) for g, x in zip(zip(*grads), (q, k, v)))
    return dq, dk, dv
