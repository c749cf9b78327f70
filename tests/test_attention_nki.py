"""The Neuron seam of document-causal attention (attention/nki_kernels.py), tested without Neuron.

Run: .venv/bin/python -m pytest tests/test_attention_nki.py -q

Every limit of both kernels, one case each; importing the seam never touches a Neuron package; calling it off
Neuron fails with a clear ImportError; and its plumbing (bounds, the per-row calls, GQA, layouts, the softmax
statistics to and from lse) runs end to end through stand-in `torch_neuronx`, `nki` and `nkilib` modules whose
kernels keep nkilib's documented contracts (tag 2.29: argument names, the layouts and shapes the kernels assert,
[bound_min, bound_max) with the causal mask), against dense PyTorch attention with autograd.
"""

import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

from conftest import REPO, RECIPES

from neuron_qwen3 import config_registry, shapes
from neuron_qwen3.attention import nki_kernels

LIMIT = {text.split(": ", 1)[1]: text for text, _ in nki_kernels.KERNEL_LIMITS}
TILE = 128


@pytest.fixture(autouse=True)
def _clean():
    nki_kernels._kernel_ops.cache_clear()
    yield
    nki_kernels._kernel_ops.cache_clear()


# ---- the kernels' shape limits -----------------------------------------------------------------


def smoke_seq_len() -> int:
    return config_registry.native_qwen3_smoke().training.seq_len


@pytest.mark.parametrize("lnc", [1, 2])
def test_shapes_both_kernels_take(lnc):
    qwen3_4b = shapes.FLAVORS["4B"].head_dim
    for head_dim, seq_len in [(qwen3_4b, 4096), (qwen3_4b, 8192), (shapes.SMOKE.head_dim, smoke_seq_len())]:
        nki_kernels.check_kernel_shapes(head_dim, seq_len, lnc)
    for head_dim, seq_len in [(128, 131072), (96, 128), (64, 256), (1, 512)]:  # the ends of the ranges
        nki_kernels.check_kernel_shapes(head_dim, seq_len, lnc)


def test_limit_texts_are_distinct():
    assert len(LIMIT) == len(nki_kernels.KERNEL_LIMITS)


# (head_dim, seq_len, LNC, the limits the message must name): one case per limit. Two cannot be broken alone:
# the backward's sequence rule implies the forward's multiple of 128, the forward's head_dim <= 128 the backward's
# equal tiles.
LIMIT_CASES = [
    ("head_dim above 128", 160, 4096, 2, ["head_dim at most 128"]),
    (
        "head_dim in unequal tiles",
        131,
        4096,
        2,
        ["head_dim at most 128", "head_dim in equal tiles of at most 128"],
    ),
    ("sequence above 131072", 128, 131072 + 512, 2, ["sequence length at most 131072"]),
    (
        "sequence not a multiple of 128",
        128,
        4000,
        1,
        [
            "sequence length a multiple of 128 (the softmax statistics the backward reads)",
            "sequence length a multiple of 512, or 128 or 256 (its key tiles)",
        ],
    ),
    ("bwd key tiles", 128, 640, 2, ["sequence length a multiple of 512, or 128 or 256 (its key tiles)"]),
    ("bwd key tiles below 512", 32, 384, 1, ["sequence length a multiple of 512, or 128 or 256 (its key tiles)"]),
    ("LNC 4", 128, 4096, 4, ["LNC 1 or 2"]),
]


@pytest.mark.parametrize("case, head_dim, seq_len, lnc, limits", LIMIT_CASES, ids=[c[0] for c in LIMIT_CASES])
def test_each_limit_is_named_with_the_values(case, head_dim, seq_len, lnc, limits):
    with pytest.raises(ValueError) as error:
        nki_kernels.check_kernel_shapes(head_dim, seq_len, lnc)
    message = str(error.value)
    assert "\n" not in message and f"head_dim={head_dim}, seq_len={seq_len}, LNC={lnc}" in message
    assert "NEURON_QWEN3_ATTENTION_KERNEL=reference" in message
    named = [short for short in LIMIT if LIMIT[short] in message]
    assert sorted(named) == sorted(limits), message


def test_every_limit_has_a_case():
    assert {limit for case in LIMIT_CASES for limit in case[-1]} == set(LIMIT)


def test_the_seam_checks_shapes_before_calling_a_kernel(monkeypatch):
    calls = []
    for name, module in stand_in_neuron_packages(calls).items():
        monkeypatch.setitem(sys.modules, name, module)
    q = torch.zeros(1, 2, 384, 16)
    with pytest.raises(ValueError, match=r"head_dim=16, seq_len=384, LNC=2: needs attention_bwd: sequence length"):
        nki_kernels.attention_forward(q, q, q, torch.zeros(1, 384, dtype=torch.int32), 0.25, 2)
    assert not [c for c in calls if c[0] == "grid"]


# ---- off Neuron --------------------------------------------------------------------------------


def test_import_does_not_touch_neuron_packages(tmp_path):
    """Importing the seam and checking shapes must not import torch_neuronx, nki or nkilib: stand-ins for them that
    fail on import sit first on the path of a fresh interpreter."""
    for package in ("torch_neuronx", "nki", "nkilib"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(f"raise AssertionError('{package} was imported')\n")
    script = textwrap.dedent(
        """
        import sys, torch
        from neuron_qwen3.attention import nki_kernels
        nki_kernels.check_kernel_shapes(128, 4096, 2)
        nki_kernels.packing_bounds(torch.tensor([0, 0, 2], dtype=torch.int32))
        loaded = [name for name in ("torch_neuronx", "nki", "nkilib") if name in sys.modules]
        assert not loaded, loaded
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(RECIPES), str(REPO)])}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_off_neuron_the_kernels_raise_a_clear_import_error(monkeypatch):
    q = torch.zeros(1, 2, 512, 16)
    starts = torch.zeros(1, 512, dtype=torch.int32)
    forward = lambda: nki_kernels.attention_forward(q, q, q, starts, 0.25, 2)  # noqa: E731
    backward = lambda: nki_kernels.attention_backward(q, q, q, q, q, q[..., 0], starts, 0.25, 1)  # noqa: E731
    for run in (forward, backward):
        with pytest.raises(ImportError, match=r"'torch_neuronx' is not importable.*NEURON_QWEN3_ATTENTION_KERNEL"):
            run()
    fake = types.ModuleType("torch_neuronx")
    fake.nki_op = fake.wrap_nki = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "torch_neuronx", fake)
    monkeypatch.setitem(sys.modules, "nki", None)  # None in sys.modules: `import nki` raises ImportError
    with pytest.raises(ImportError, match="'nki' is not importable"):
        forward()
    monkeypatch.setitem(sys.modules, "nki", types.ModuleType("nki"))
    with pytest.raises(ImportError, match="'nkilib' is not importable"):
        forward()


# ---- the bounds ---------------------------------------------------------------------------------


def doc_starts(*rows) -> torch.Tensor:
    """[B, L] int32 starts of rows of document lengths: each token's document's first index."""
    starts = [torch.cat([torch.full((n,), sum(row[:i])) for i, n in enumerate(row)]) for row in rows]
    return torch.stack(starts).to(torch.int32)


def test_packing_bounds_are_nkilibs_cu_seqlens_expansion():
    """attention_bwd's docstring example: documents of 2, 3 and 2 tokens."""
    bound_min, bound_max = nki_kernels.packing_bounds(doc_starts([2, 3, 2])[0])
    assert bound_min.dtype == bound_max.dtype == torch.float32
    assert bound_min.tolist() == [0, 0, 2, 2, 2, 5, 5]
    assert bound_max.tolist() == [2, 2, 5, 5, 5, 7, 7]
    one_document = nki_kernels.packing_bounds(torch.zeros(5, dtype=torch.int32))
    assert one_document[0].tolist() == [0] * 5 and one_document[1].tolist() == [5] * 5


# ---- the NKI path with stand-in Neuron packages ------------------------------------------------


def _allowed(length_q, length_k, causal, bound_min, bound_max):
    """[Lq, Lk]: the kernels' mask, causal j <= i and the packing range bound_min[i] <= j < bound_max[i]."""
    i, j = torch.arange(length_q)[:, None], torch.arange(length_k)[None, :]
    allowed = torch.ones(length_q, length_k, dtype=torch.bool)
    if causal:
        allowed &= j <= i
    if bound_min is not None:
        allowed &= (j >= bound_min.reshape(-1, 1)) & (j < bound_max.reshape(-1, 1))
    return allowed


def _check_bounds(bound_min, bound_max, shape):
    assert (bound_min is None) == (bound_max is None), "bound_min and bound_max must both be set or both be None"
    if bound_min is not None:
        for bound in (bound_min, bound_max):
            assert tuple(bound.shape) == shape and bound.dtype == torch.float32, (bound.shape, bound.dtype)


def attention_cte(
    *,
    q,
    k,
    v,
    scale=1.0,
    causal_mask=True,
    tp_q=True,
    tp_k=False,
    tp_out=False,
    cache_softmax=False,
    bound_min=None,
    bound_max=None,
):
    """attention_cte's documented contract: q (bs, Lq, d) if tp_q else (bs, d, Lq); k (bs_kv, Lk, d) if tp_k else
    (bs_kv, d, Lk); v (bs_kv, Lk, d); query batch h reads kv batch h // (bs / bs_kv); bounds (Lq, 1); the packing
    path asserts scale 1.0; cache_softmax returns (out, -max, 1/sum), each (bs, 128, Lq / 128)."""
    q = q if tp_q else q.transpose(1, 2)
    k = k.transpose(1, 2) if tp_k else k
    bs, length_q, d = q.shape
    bs_kv, length_k = k.shape[0], k.shape[2]
    assert d <= 128 and bs % bs_kv == 0 and tuple(k.shape) == (bs_kv, d, length_k), (q.shape, k.shape)
    assert tuple(v.shape) == (bs_kv, length_k, d), v.shape
    _check_bounds(bound_min, bound_max, (length_q, 1))
    assert bound_min is None or scale == 1.0, "range_select path doesn't support scale != 1.0"
    assert not cache_softmax or length_q % TILE == 0
    group = bs // bs_kv
    scores = q.double() @ k.double().repeat_interleave(group, 0) * scale
    scores = scores.masked_fill(~_allowed(length_q, length_k, causal_mask, bound_min, bound_max), float("-inf"))
    row_max = scores.amax(-1, keepdim=True)
    exp = torch.exp(scores - row_max)
    total = exp.sum(-1, keepdim=True)
    out = (exp / total @ v.double().repeat_interleave(group, 0)).to(q.dtype)
    out = out.transpose(1, 2) if tp_out else out
    if not cache_softmax:
        return out
    tiled = lambda x: x.reshape(bs, length_q // TILE, TILE).transpose(1, 2).float()  # noqa: E731  [p, g]
    return out, tiled(-row_max), tiled(1 / total)


def attention_bwd(
    *,
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    dy_ref,
    lse_ref,
    sinks_ref=None,
    bound_min=None,
    bound_max=None,
    use_causal_mask=False,
    mixed_precision=False,
    softmax_scale=None,
    sliding_window=None,
):
    """attention_bwd's documented contract: q, o, dy [bs, nheads, d, Lq]; k, v [bs, nheads_kv, d, Lk]; lse_ref
    [bs, nheads, 128, Lq / 128]; bounds (Lq,) fp32; the probabilities recomputed as exp(scale * q.k - lse), and
    rowsum(dy * o) from the o given; dk, dv summed over each kv head's query heads."""
    bs, heads, d, length_q = q_ref.shape
    heads_kv, length_k = k_ref.shape[1], k_ref.shape[3]
    assert heads % heads_kv == 0
    assert tuple(k_ref.shape) == tuple(v_ref.shape) == (bs, heads_kv, d, length_k)
    assert tuple(o_ref.shape) == tuple(dy_ref.shape) == (bs, heads, d, length_q)
    assert tuple(lse_ref.shape) == (bs, heads, TILE, length_q // TILE), lse_ref.shape
    assert not use_causal_mask or length_q == length_k
    assert q_ref.dtype == k_ref.dtype == v_ref.dtype == o_ref.dtype == dy_ref.dtype
    _check_bounds(bound_min, bound_max, (length_q,))
    assert length_q % TILE == 0 and length_k % min(512, length_k) == 0 and 8192 % min(512, length_k) == 0
    scale = softmax_scale or d**-0.5
    group = heads // heads_kv
    q, o, dy = (x.double().transpose(-1, -2) for x in (q_ref, o_ref, dy_ref))  # [bs, h, L, d]
    k, v = (x.double().repeat_interleave(group, 1).transpose(-1, -2) for x in (k_ref, v_ref))
    lse = lse_ref.double().transpose(-1, -2).reshape(bs, heads, length_q)
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(
        ~_allowed(length_q, length_k, use_causal_mask, bound_min, bound_max), float("-inf")
    )
    probs = torch.exp(scores - lse[..., None])
    dscores = probs * (dy @ v.transpose(-1, -2) - (dy * o).sum(-1, keepdim=True)) * scale
    dq, dk, dv = dscores @ k, dscores.transpose(-1, -2) @ q, probs.transpose(-1, -2) @ dy
    summed = lambda x: x.reshape(bs, heads_kv, group, length_k, d).sum(2)  # noqa: E731
    d_major = lambda x, like: x.transpose(-1, -2).to(like.dtype)  # noqa: E731
    return d_major(dq, q_ref), d_major(summed(dk), k_ref), d_major(summed(dv), v_ref)


def stand_in_neuron_packages(calls: list) -> dict:
    """torch_neuronx, nki and the two nkilib attention modules, recording how the seam calls them."""

    def nki_op(name, mutates_args):
        calls.append(("nki_op", name))
        return lambda fn: fn

    class Launch:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                assert not args and all(isinstance(v, torch.Tensor | bool | int | float) for v in kwargs.values())
                flags = {name: value for name, value in kwargs.items() if not torch.is_tensor(value)}
                calls.extend([("grid", self.kernel.__name__, grid), ("flags", self.kernel.__name__, flags)])
                return self.kernel(**kwargs)

            return launch

    names = ("torch_neuronx", "nki", "nkilib", "nkilib.core", "nkilib.core.attention")
    modules = {name: types.ModuleType(name) for name in names}
    modules["torch_neuronx"].nki_op, modules["torch_neuronx"].wrap_nki = nki_op, Launch
    for kernel in (attention_cte, attention_bwd):
        module = types.ModuleType(f"nkilib.core.attention.{kernel.__name__}")
        setattr(module, kernel.__name__, kernel)
        modules[module.__name__] = module
    return modules


@pytest.fixture
def stand_ins(monkeypatch):
    calls = []
    for name, module in stand_in_neuron_packages(calls).items():
        monkeypatch.setitem(sys.modules, name, module)
    return calls


def dense_attention(q, k, v, starts, scale):
    """(out, lse): plain masked softmax over keys starts[b, i] <= j <= i, kv heads repeated for GQA."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    i, j = torch.arange(q.shape[2])[:, None], torch.arange(q.shape[2])[None, :]
    allowed = (j <= i) & (j >= starts[:, None, :, None])
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


# B 2, GQA 4 over 2, one window of 512 (both kernels take it) holding documents that are no multiples of 128.
DOCUMENTS = ([100, 237, 175], [37, 300, 129, 46])


def run_against_dense(lnc: int, documents=DOCUMENTS, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    starts = doc_starts(*documents)
    batch, length = starts.shape
    q = torch.randn(batch, 4, length, 16, generator=gen, requires_grad=True)
    k, v = (torch.randn(batch, 2, length, 16, generator=gen, requires_grad=True) for _ in range(2))
    grad_out = torch.randn(batch, 4, length, 16, generator=gen)
    scale = 16**-0.5

    want_out, want_lse = dense_attention(q, k, v, starts, scale)
    want_grads = torch.autograd.grad(want_out, (q, k, v), grad_out)
    out, lse = nki_kernels.attention_forward(q.detach(), k.detach(), v.detach(), starts, scale, lnc)
    grads = nki_kernels.attention_backward(grad_out, q.detach(), k.detach(), v.detach(), out, lse, starts, scale, lnc)

    assert out.dtype == q.dtype and lse.dtype == torch.float32 and lse.shape == want_lse.shape
    close = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, want_out.detach(), **close)
    torch.testing.assert_close(lse, want_lse.detach(), **close)
    for got, want, x in zip(grads, want_grads, (q, k, v)):
        assert got.shape == x.shape and got.dtype == x.dtype
        torch.testing.assert_close(got, want, **close)


@pytest.mark.parametrize("lnc", [2, 1])
def test_kernels_through_the_seam_equal_dense_attention(stand_ins, lnc):
    run_against_dense(lnc)
    assert [c for c in stand_ins if c[0] == "nki_op"] == [
        ("nki_op", f"neuron_qwen3_nki::attention_cte_lnc{lnc}"),
        ("nki_op", f"neuron_qwen3_nki::attention_bwd_lnc{lnc}"),
    ]
    # One call per batch row, each on the LNC's grid, with the flags the mapping needs.
    assert [c[1:] for c in stand_ins if c[0] == "grid"] == [
        ("attention_cte", lnc),
        ("attention_cte", lnc),
        ("attention_bwd", lnc),
        ("attention_bwd", lnc),
    ]
    flags = {c[1]: c[2] for c in stand_ins if c[0] == "flags"}
    assert flags["attention_cte"] == dict(
        scale=1.0, causal_mask=True, tp_q=True, tp_k=False, tp_out=False, cache_softmax=True
    )
    assert flags["attention_bwd"] == dict(use_causal_mask=True, mixed_precision=True, softmax_scale=16**-0.5)


def test_one_document_per_row_and_bf16(stand_ins):
    """Plain causal rows (one document each) and bf16 inputs: out, dq, dk, dv come back in bf16."""
    run_against_dense(2, documents=([512], [512]), seed=1)
    q = torch.randn(1, 4, 256, 32).bfloat16()
    k, v = torch.randn(2, 1, 2, 256, 32).bfloat16()
    starts = doc_starts([200, 56])
    out, lse = nki_kernels.attention_forward(q, k, v, starts, 32**-0.5, 2)
    grads = nki_kernels.attention_backward(q, q, k, v, out, lse, starts, 32**-0.5, 2)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert [g.dtype for g in grads] == [torch.bfloat16] * 3 and [g.shape for g in grads] == [q.shape, k.shape, v.shape]


BROKEN_BOUNDS = {
    "causal only (bound_min 0)": lambda s: (torch.zeros(len(s)), torch.full((len(s),), float(len(s)))),
    "the end one short": lambda s: (s.float(), torch.arange(len(s), dtype=torch.float32)),
    "starts one late": lambda s: (s.float() + 1, torch.full((len(s),), float(len(s)))),
}


@pytest.mark.parametrize("broken", list(BROKEN_BOUNDS), ids=list(BROKEN_BOUNDS))
def test_a_wrong_bounds_mapping_fails_the_comparison(stand_ins, monkeypatch, broken):
    """The comparison can fail: the same run with the bounds mapped wrongly does not equal dense attention."""
    monkeypatch.setattr(nki_kernels, "packing_bounds", BROKEN_BOUNDS[broken])
    with pytest.raises(AssertionError):
        run_against_dense(2)


def test_the_stand_in_keeps_attention_ctes_statistics_layout():
    """Query g*128 + p's statistics sit at [p, g], and they give the log-sum-exp, as nkilib's backward reference
    derives it: lse = -(neg_max + log(sum_recip))."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 256, 8, generator=gen) for _ in range(3))
    _, neg_max, sum_recip = attention_cte(q=q, k=k.transpose(1, 2), v=v, cache_softmax=True)
    scores = (q @ k.transpose(1, 2)).masked_fill(torch.ones(256, 256, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, -1)[0]
    for i in (0, 1, 127, 128, 200, 255):
        p, g = i % 128, i // 128
        torch.testing.assert_close(-(neg_max[0, p, g] + torch.log(sum_recip[0, p, g])), lse[i])
