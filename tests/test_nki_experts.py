"""NKIGroupedExperts (reference path) against torchtitan's own GroupedExperts and MoE, the op, the override.

Run: .venv/bin/python -m pytest tests/test_nki_experts.py -q

fp32: torchtitan's GroupedExperts.forward hardcodes `.bfloat16()` casts, so the fp32 comparisons run it with
`Tensor.bfloat16` made the identity (fixture `titan_in_fp32`) and NKIGroupedExperts with compute_dtype="float32".
Tolerances: TOLERANCE in moe/reference.py (with what was measured). In bf16 the input gradient differs by one
rounding: GroupedExperts casts x twice and sums its two gradients in fp32, NKIGroupedExperts once, in bf16.
Nothing here needs Neuron; the Neuron seam (kernel limits, the kernels' plumbing with stand-ins) is
tested in test_nki_kernels.py.
"""

import pytest
import torch

from torchtitan.config.override import OverrideConfig, apply_overrides
from torchtitan.models.common import CosSinRoPE
from torchtitan.models.common.moe import GroupedExperts, RoutedExperts
from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher
from torchtitan.models.qwen3 import _build_qwen3_moe_layers, model_registry

from moe_routing import expert_affinities_masked, routing_to_block_layout

from neuron_qwen3.config_registry import NKI_EXPERTS_OVERRIDE as OVERRIDE
from neuron_qwen3.moe import experts as moe_experts
from neuron_qwen3.moe.experts import NKIGroupedExperts, blockwise_moe_experts
from neuron_qwen3.moe.layout import BlockLayout, ExpertWeights, max_num_blocks
from neuron_qwen3.moe.reference import TOLERANCE

FP32, BF16 = TOLERANCE["float32"], TOLERANCE["bfloat16"]


@pytest.fixture
def titan_in_fp32(monkeypatch):
    """torchtitan's GroupedExperts.forward, unmodified, with its bf16 casts turned into no-ops."""
    monkeypatch.setattr(torch.Tensor, "bfloat16", lambda self, *a, **k: self)


def scale_close(actual, expected, rel):
    """max |actual - expected| <= rel * max |expected| (a tolerance relative to the tensor's scale)."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    scale = expected.abs().max().clamp_min(1e-30)
    err = (actual - expected).abs().max()
    assert err <= rel * scale, f"max error {err:.3e} > {rel:g} x scale {scale:.3e}"


def make_pair(dim, hidden, num_experts, block_size, compute_dtype, block_count="exact", seed=0, kernel="auto"):
    """torchtitan's GroupedExperts and an NKIGroupedExperts with the same weights."""
    titan = GroupedExperts(GroupedExperts.Config(dim=dim, hidden_dim=hidden, num_experts=num_experts))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in titan.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    nki = NKIGroupedExperts(
        NKIGroupedExperts.Config(
            dim=dim,
            hidden_dim=hidden,
            num_experts=num_experts,
            block_size=block_size,
            compute_dtype=compute_dtype,
            block_count=block_count,
            kernel=kernel,
        )
    )
    nki.load_state_dict(titan.state_dict())
    return titan, nki


def assert_same_as_torchtitan(titan, nki, counts, dim, seed, out_rel, grad_rel):
    """Run both on the same random rows; output, input grad and every weight grad within the tolerances.

    Returns torchtitan's output and nki's weight grads for the callers' extra checks."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(int(counts.sum()), dim, generator=gen)
    grad_out = torch.randn(x.shape, generator=gen)
    out_t, gx_t, gw_t = run(titan, x, counts, grad_out)
    out_n, gx_n, gw_n = run(nki, x, counts, grad_out)
    scale_close(out_n, out_t, out_rel)
    scale_close(gx_n, gx_t, grad_rel)
    assert gw_n.keys() == gw_t.keys() == {"w1_EFD", "w2_EDF", "w3_EFD"}
    for name in gw_t:
        scale_close(gw_n[name], gw_t[name], grad_rel)
    return out_t, gw_n


def run(module, x, counts, grad_out):
    x = x.detach().clone().requires_grad_()
    out = module(x, counts)
    out.backward(grad_out)
    grads = {name.removeprefix("_orig_mod."): p.grad for name, p in module.named_parameters()}  # compiled too
    for p in module.parameters():
        p.grad = None
    return out.detach(), x.grad, grads


# (name, tokens per expert, dim, hidden, block size): idle experts, one expert taking every row,
# block sizes that divide the counts and ones that do not.
GROUPED_CASES = [
    ("random_b4", [5, 3, 0, 9, 2, 7], 32, 16, 4),
    ("idle_experts_b3", [0, 0, 7, 0, 1, 0, 0, 4], 16, 24, 3),
    ("one_expert_all_rows_b8", [0, 0, 37, 0], 16, 8, 8),
    ("divides_b4", [8, 4, 12, 0, 4], 32, 16, 4),
    ("divides_none_b5", [8, 4, 12, 1, 6], 32, 16, 5),
    ("block_larger_than_counts_b128", [3, 9, 1, 0, 5], 64, 48, 128),
    ("block_one", [2, 0, 3], 16, 8, 1),
]


def random_cases(n=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for i in range(n):
        num_experts = int(torch.randint(1, 10, (), generator=gen))
        counts = torch.randint(0, 12, (num_experts,), generator=gen)
        counts[torch.rand(num_experts, generator=gen) < 0.3] = 0
        dim = 8 * int(torch.randint(1, 6, (), generator=gen))
        hidden = 8 * int(torch.randint(1, 5, (), generator=gen))
        block_size = int(torch.randint(1, 10, (), generator=gen))
        cases.append((f"seeded{i}", counts.tolist(), dim, hidden, block_size))
    return cases


ALL_CASES = GROUPED_CASES + random_cases()


@pytest.mark.parametrize("block_count", ["exact", "static"])
@pytest.mark.parametrize("name, counts, dim, hidden, block_size", ALL_CASES, ids=[c[0] for c in ALL_CASES])
def test_matches_grouped_experts_fp32(titan_in_fp32, name, counts, dim, hidden, block_size, block_count):
    counts = torch.tensor(counts)
    titan, nki = make_pair(dim, hidden, len(counts), block_size, "float32", block_count)
    out_t, gw_n = assert_same_as_torchtitan(
        titan, nki, counts, dim, seed=1, out_rel=FP32["output"], grad_rel=FP32["gradients"]
    )
    assert out_t.dtype == torch.float32  # the no-op cast held: torchtitan really ran in fp32
    idle = counts == 0
    if idle.any():  # experts that received nothing get exactly zero gradient
        assert not gw_n["w1_EFD"][idle].any() and not gw_n["w2_EDF"][idle].any()


@pytest.mark.parametrize("name, counts, dim, hidden, block_size", ALL_CASES, ids=[c[0] for c in ALL_CASES])
def test_matches_grouped_experts_bf16(name, counts, dim, hidden, block_size):
    counts = torch.tensor(counts)
    titan, nki = make_pair(dim, hidden, len(counts), block_size, "bfloat16")
    assert_same_as_torchtitan(titan, nki, counts, dim, seed=2, out_rel=BF16["output"], grad_rel=BF16["gradients"])


def test_rows_past_the_counts_get_zero_output():
    """EP capacity padding: GroupedExperts leaves such rows undefined; ours are zero, and no grad."""
    _, nki = make_pair(16, 8, 3, 4, "float32")
    x = torch.randn(12, 16, requires_grad=True)
    out = nki(x, torch.tensor([3, 0, 5]))
    assert not out[8:].any()
    out.sum().backward()
    assert not x.grad[8:].any() and x.grad[:8].any()


def test_compiles_in_one_graph():
    """torch.compile(fullgraph=True), as the Neuron backend wants it: no graph break (block_count
    "auto" picks the static block count under compile) and the eager result."""
    _, nki = make_pair(16, 8, 4, 4, "float32")
    counts = torch.tensor([3, 0, 5, 4])
    x = torch.randn(12, 16)
    eager = run(nki, x, counts, torch.ones(12, 16))
    compiled = run(torch.compile(nki, fullgraph=True, backend="aot_eager"), x, counts, torch.ones(12, 16))
    torch.testing.assert_close(compiled, eager)  # output, input grad, every weight grad


def test_logs_kernel_path_once(caplog):
    moe_experts._log_kernel_path.cache_clear()
    _, nki = make_pair(16, 8, 3, 4, "float32")
    counts = torch.tensor([2, 1, 3])
    with caplog.at_level("INFO"):
        nki(torch.randn(6, 16), counts)
        nki(torch.randn(6, 16), counts)
    lines = [r.getMessage() for r in caplog.records if "nki_moe kernel path" in r.getMessage()]
    assert len(lines) == 1 and "nki_moe kernel path: reference" in lines[0]


# ---- the whole MoE layer: router, dispatcher, experts, combine ---------------------------------


def moe_layer_configs(num_layers=2):
    """Two copies of torchtitan's debugmodel_moe Qwen3 config, cut to `num_layers` layers."""

    def cut():
        config = model_registry("debugmodel_moe").model
        del config.layers[num_layers:]
        return config

    return cut(), cut()


def small_moe_layer_config():
    """One Qwen3 MoE layer from torchtitan's own builder (softmax top-k router with renormalised
    weights), at a size that runs in a second: 16 experts, top-4."""
    return _build_qwen3_moe_layers(
        n_layers=1,
        dim=64,
        n_heads=2,
        n_kv_heads=1,
        head_dim=32,
        moe_hidden_dim=32,
        num_experts=16,
        top_k=4,
        attn_backend="flex",
        moe_comm_backend="standard",
        rope=CosSinRoPE.Config(dim=32, max_seq_len=64, theta=1000000.0),
    )[0].moe


@pytest.mark.filterwarnings("ignore:In CPU autocast")  # torchtitan's router asks CPU autocast for fp32
@pytest.mark.parametrize("fp32", [True, False], ids=["fp32", "bf16"])
def test_moe_layer_matches_torchtitan(request, fp32):
    """A whole Qwen3 MoE layer: router, token dispatcher, experts, routed-weight combine."""
    if fp32:
        request.getfixturevalue("titan_in_fp32")
    native_cfg, nki_cfg = small_moe_layer_config(), small_moe_layer_config()
    settings = {"compute_dtype": "float32" if fp32 else "bfloat16", "block_size": 8}
    assert len(apply_overrides(OverrideConfig(imports=[(OVERRIDE, settings)]), nki_cfg)) == 1
    torch.manual_seed(0)
    native = native_cfg.build()
    native.init_states()
    nki = nki_cfg.build()
    nki.load_state_dict(native.state_dict())
    assert isinstance(nki.routed_experts.inner_experts, NKIGroupedExperts)

    x = torch.randn(2, 24, 64)
    grad_out = torch.randn(x.shape)
    results = []
    for layer in (native, nki):
        xi = x.clone().requires_grad_()
        out = layer(xi)
        out.backward(grad_out)
        grads = {n: p.grad for n, p in layer.named_parameters()}
        results.append((out.detach(), xi.grad, grads))
    (out_t, gx_t, gw_t), (out_n, gx_n, gw_n) = results
    rel_out, rel_grad = (FP32 if fp32 else BF16).values()
    scale_close(out_n, out_t, rel_out)
    scale_close(gx_n, gx_t, rel_grad)
    assert gw_t.keys() == gw_n.keys()
    for name in gw_t:  # experts and the router gate
        scale_close(gw_n[name], gw_t[name], rel_grad)


def test_op_with_routing_weights_matches_routed_experts(titan_in_fp32):
    """The op's own dispatch + post-scaling + combine, with real top-k weights, against
    torchtitan's RoutedExperts (LocalTokenDispatcher + GroupedExperts): output and the
    gradients of tokens, weights and routing scores."""
    num_tokens, dim, hidden, num_experts, top_k, block_size = 19, 16, 8, 6, 3, 4
    routed = RoutedExperts(
        RoutedExperts.Config(
            inner_experts=GroupedExperts.Config(dim=dim, hidden_dim=hidden, num_experts=num_experts),
            token_dispatcher=LocalTokenDispatcher.Config(num_experts=num_experts, top_k=top_k),
        )
    )
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in routed.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    experts = routed.inner_experts
    # distinct experts per token, and expert 5 idle
    ids = torch.stack([torch.randperm(num_experts - 1, generator=gen)[:top_k] for _ in range(num_tokens)])
    x = torch.randn(num_tokens, dim, generator=gen)
    scores = torch.rand(num_tokens, top_k, generator=gen)
    grad_out = torch.randn(num_tokens, dim, generator=gen)
    counts = torch.bincount(ids.reshape(-1), minlength=num_experts)

    x_t, s_t = x.clone().requires_grad_(), scores.clone().requires_grad_()
    out_t = routed(x_t.view(1, num_tokens, dim), s_t.view(1, num_tokens, top_k), ids.view(1, num_tokens, top_k), counts)
    out_t.view(num_tokens, dim).backward(grad_out)
    w_grads_t = [experts.w1_EFD.grad, experts.w3_EFD.grad, experts.w2_EDF.grad]

    w1, w3, w2 = (w.detach().clone().requires_grad_() for w in (experts.w1_EFD, experts.w3_EFD, experts.w2_EDF))
    x_n, s_n = x.clone().requires_grad_(), scores.clone().requires_grad_()
    layout = routing_to_block_layout(ids, num_experts, block_size)
    out_n = blockwise_moe_experts(
        torch.cat([x_n, x_n.new_zeros(1, dim)]),
        expert_affinities_masked(s_n, ids, num_experts),
        ExpertWeights(w1, w3, w2),
        layout,
    )
    out_n.backward(grad_out)
    scale_close(out_n.detach(), out_t.detach().view(num_tokens, dim), FP32["output"])
    scale_close(x_n.grad, x_t.grad, FP32["gradients"])
    scale_close(s_n.grad, s_t.grad, FP32["gradients"])
    for got, want in zip([w1.grad, w3.grad, w2.grad], w_grads_t):
        scale_close(got, want, FP32["gradients"])


# ---- the op itself -----------------------------------------------------------------------------


def op_inputs(
    dtype=torch.float32, seed=0, num_tokens=11, dim=8, hidden=6, num_experts=5, top_k=2, block_size=3, static=False
):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(num_tokens)])
    num_blocks = max_num_blocks(num_tokens * top_k, num_experts, block_size) if static else None
    layout = routing_to_block_layout(ids, num_experts, block_size, num_blocks)
    tokens = torch.randn(num_tokens, dim, generator=gen, dtype=dtype)
    hidden_states = torch.cat([tokens, torch.zeros(1, dim, dtype=dtype)])
    affinities = expert_affinities_masked(torch.rand(num_tokens, top_k, generator=gen, dtype=dtype), ids, num_experts)
    w1, w3 = (torch.randn(num_experts, hidden, dim, generator=gen, dtype=dtype) * 0.5 for _ in range(2))
    w2 = torch.randn(num_experts, dim, hidden, generator=gen, dtype=dtype) * 0.5
    return [hidden_states, affinities, w1, w3, w2, layout.token_position_to_id, layout.block_to_expert, block_size]


def experts_of(hidden_states, affinities, w1, w3, w2, token_position_to_id, block_to_expert, block_size):
    """blockwise_moe_experts on op_inputs' flat list (the op's own signature)."""
    layout = BlockLayout(token_position_to_id, block_to_expert, hidden_states.shape[0] - 1, block_size)
    return blockwise_moe_experts(hidden_states, affinities, ExpertWeights(w1, w3, w2), layout)


PATH = ("auto", 2)  # the op's kernel choice and LNC: the reference on CPU


@pytest.mark.parametrize("static", [False, True])
def test_opcheck(static):
    args = op_inputs(static=static)
    for t in args[:5]:
        t.requires_grad_()
    result = torch.library.opcheck(torch.ops.neuron_qwen3.blockwise_moe_experts.default, [*args, *PATH])
    assert set(result.values()) == {"SUCCESS"}, result
    out, gate_up_act_T, down_act = torch.ops.neuron_qwen3.blockwise_moe_experts(*args, *PATH)
    grad_args = [
        torch.randn_like(out),
        *[a.detach() for a in args[:5]],
        gate_up_act_T.detach(),
        down_act.detach(),
        *args[5:],
        *PATH,
    ]
    for affinity_grad in (True, False):
        result = torch.library.opcheck(
            torch.ops.neuron_qwen3.blockwise_moe_experts_backward.default, [*grad_args, affinity_grad]
        )
        assert set(result.values()) == {"SUCCESS"}, result


def test_op_gradcheck_fp64():
    """The hand-written backward against finite differences, affinities included."""
    args = op_inputs(dtype=torch.float64, seed=3, num_tokens=6, dim=4, hidden=3, num_experts=3, block_size=2)
    for t in args[:5]:
        t.requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: experts_of(*a, *args[5:]), args[:5])


def test_op_block_order_does_not_matter():
    """The op takes any block order, e.g. one expert's blocks split apart (its weight gradients
    then accumulate over several runs); the result is that of the sorted layout."""
    args = op_inputs(dtype=torch.float64, seed=7, num_tokens=13, num_experts=3, block_size=2)
    *tensors, tp2id, b2e, block_size = args
    num_blocks = b2e.shape[0]
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(b2e[order], b2e)
    shuffled = (tp2id.view(num_blocks, block_size)[order].reshape(-1), b2e[order], block_size)
    results = []
    for layout in ((tp2id, b2e, block_size), shuffled):
        inputs = [t.detach().clone().requires_grad_() for t in tensors]
        out = experts_of(*inputs, *layout)
        out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
        results.append([out.detach()] + [t.grad for t in inputs])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want)


def test_no_rows():
    """An expert-parallel rank can receive no tokens at all."""
    _, nki = make_pair(16, 8, 3, 4, "float32")
    x = torch.randn(0, 16, requires_grad=True)
    out = nki(x, torch.zeros(3, dtype=torch.int64))
    assert out.shape == (0, 16)
    out.sum().backward()
    assert not nki.w1_EFD.grad.any()


def test_op_checkpoints_are_the_kernel_layout():
    """gate_up_activations_T [N, 2, I, B] and down_activations [N, B, H] hold, per block slot,
    the pre-activation gate/up products and the unscaled down products."""
    args = op_inputs(seed=4)
    hidden_states, _, w1, w3, w2, tp2id, b2e, block_size = args
    out, gate_up_act_T, down_act = torch.ops.neuron_qwen3.blockwise_moe_experts(*args, *PATH)
    num_blocks, hidden = b2e.shape[0], w1.shape[1]
    assert gate_up_act_T.shape == (num_blocks, 2, hidden, block_size)
    assert down_act.shape == (num_blocks, block_size, hidden_states.shape[1])
    for n in range(num_blocks):
        e = int(b2e[n])
        x = hidden_states[tp2id[n * block_size : (n + 1) * block_size].long()]
        torch.testing.assert_close(gate_up_act_T[n, 0].T, x @ w1[e].T)
        torch.testing.assert_close(gate_up_act_T[n, 1].T, x @ w3[e].T)
        h = torch.nn.functional.silu(x @ w1[e].T) * (x @ w3[e].T)
        torch.testing.assert_close(down_act[n], h @ w2[e].T)


# ---- the override ------------------------------------------------------------------------------


def test_override_replaces_every_moe_layer_and_keeps_state_dict():
    native_cfg, nki_cfg = moe_layer_configs(3)
    before = [layer.moe.routed_experts.inner_experts for layer in nki_cfg.layers]
    lines = apply_overrides(OverrideConfig(imports=[OVERRIDE]), nki_cfg)
    assert len(lines) == 3 and all(OVERRIDE in line and "NKIGroupedExperts.Config" in line for line in lines)
    for layer, old in zip(nki_cfg.layers, before, strict=True):
        experts = layer.moe.routed_experts.inner_experts
        assert type(old) is GroupedExperts.Config
        assert type(experts) is NKIGroupedExperts.Config and experts.block_size == 256  # both kernels take 256
        assert (experts.dim, experts.hidden_dim, experts.num_experts) == (old.dim, old.hidden_dim, old.num_experts)
        assert experts.param_init is old.param_init and experts.sharding_config is old.sharding_config
    with torch.device("meta"):
        native, nki = native_cfg.build(), nki_cfg.build()
    native_sd = {k: (v.shape, v.dtype) for k, v in native.state_dict().items()}
    nki_sd = {k: (v.shape, v.dtype) for k, v in nki.state_dict().items()}
    assert nki_sd == native_sd
    assert sum(isinstance(m, NKIGroupedExperts) for m in nki.modules()) == 3


def test_override_settings_and_unknown_settings():
    _, cfg = moe_layer_configs(1)
    apply_overrides(OverrideConfig(imports=[(OVERRIDE, {"block_size": 512, "block_count": "static"})]), cfg)
    experts = cfg.layers[0].moe.routed_experts.inner_experts
    assert (experts.block_size, experts.block_count) == (512, "static")
    _, cfg = moe_layer_configs(1)
    with pytest.raises(ValueError, match="blocksize"):
        apply_overrides(OverrideConfig(imports=[(OVERRIDE, {"blocksize": 256})]), cfg)
