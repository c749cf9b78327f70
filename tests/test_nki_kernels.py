"""The Neuron seam of the nki_moe experts (moe/nki_kernels.py), tested without Neuron.

Run: .venv/bin/python -m pytest tests/test_nki_kernels.py -q

Every limit of both kernels, one case each, and the checks at model build; importing and running the
reference never touches a Neuron package; forcing the NKI path off Neuron fails with a clear ImportError;
and the NKI path's plumbing runs end to end with stand-in `torch_neuronx`, `nki` and `nkilib` modules
whose kernels keep nkilib's documented contracts (the call pattern included: an own
`@nki.jit(mode="trace")` function, flat scalars through `wrap_nki(fn)[lnc](**kwargs)`): training through
moe_cte and blockwise_mm_bwd, a decode step's rows through moe_tkg.
"""

import dataclasses
import enum
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

from conftest import REPO, RECIPES
from test_nki_experts import BF16, FP32, assert_same_as_torchtitan, make_pair, scale_close

from neuron_qwen3 import config_registry, neuron_sdk
from neuron_qwen3.moe import experts, nki_kernels
from neuron_qwen3.moe.experts import NKIGroupedExperts
from neuron_qwen3.moe.layout import pack_down, pack_gate_up

LIMIT = {text.split(": ", 1)[1]: text for text, _ in nki_kernels.KERNEL_LIMITS}


@pytest.fixture(autouse=True)
def _clean():
    nki_kernels._kernel_ops.cache_clear()
    yield
    nki_kernels._kernel_ops.cache_clear()


@pytest.fixture
def titan_in_fp32(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "bfloat16", lambda self, *a, **k: self)


# ---- the kernels' shape limits -----------------------------------------------------------------


@pytest.mark.parametrize(
    "hidden, inter, block, lnc",
    [(2048, 768, 256, 2), (2048, 768, 256, 1), (2048, 768, 1024, 2), (512, 64, 256, 2), (8192, 16384, 512, 1)],
)
def test_shapes_both_kernels_take(hidden, inter, block, lnc):
    nki_kernels.check_kernel_shapes(hidden, inter, block, lnc)  # Qwen3-30B-A3B, the smoke MoE, the range ends


# (H, I, B, LNC, the limits the message must name): one case per limit; two limits of the backward cannot be
# broken alone, since the forward's H % 512 and I % 16 already imply part of them.
LIMIT_CASES = [
    ("fwd block multiple of 256", 2048, 768, 128, 2, ["block size B a multiple of 256"]),
    ("fwd H above 8192", 8704, 768, 256, 2, ["hidden dim H from 512 to 8192"]),
    ("fwd H below 512", 256, 768, 256, 1, ["hidden dim H from 512 to 8192", "hidden dim H a multiple of 512"]),
    ("fwd H multiple of 512", 2112, 768, 256, 2, ["hidden dim H a multiple of 512"]),
    (
        "fwd I multiple of 16",
        2048,
        760,
        256,
        1,
        ["expert hidden dim I a multiple of 16", "expert hidden dim I per logical core (I / LNC) a multiple of 32"],
    ),
    ("bwd block sizes", 2048, 768, 768, 2, ["block size B one of 128, 256, 512, 1024"]),
    (
        "bwd H per core",
        2080,
        768,
        256,
        2,
        ["hidden dim H a multiple of 512", "hidden dim H per logical core (H / LNC) a multiple of 32"],
    ),
    ("bwd I per core", 2048, 784, 256, 2, ["expert hidden dim I per logical core (I / LNC) a multiple of 32"]),
]


@pytest.mark.parametrize("case, hidden, inter, block, lnc, limits", LIMIT_CASES, ids=[c[0] for c in LIMIT_CASES])
def test_each_limit_is_named_with_the_values(case, hidden, inter, block, lnc, limits):
    with pytest.raises(ValueError) as error:
        nki_kernels.check_kernel_shapes(hidden, inter, block, lnc)
    message = str(error.value)
    assert "\n" not in message and f"H={hidden}, I={inter}, B={block}, LNC={lnc}" in message
    named = [short for short in LIMIT if LIMIT[short] in message]
    assert sorted(named) == sorted(limits), message


def test_every_limit_has_a_case():
    assert {limit for case in LIMIT_CASES for limit in case[-1]} == set(LIMIT)


def test_model_build_checks_shapes_when_the_kernels_will_run(monkeypatch):
    config = NKIGroupedExperts.Config(dim=128, hidden_dim=64, num_experts=2)  # the old smoke MoE: H 128
    NKIGroupedExperts(config)  # reference path: any shape
    monkeypatch.setattr(experts.titan_utils, "device_type", "neuron")  # what torchtitan picks on Trainium
    with pytest.raises(ValueError, match=r"H=128, I=64, B=256, LNC=2: needs moe_cte: hidden dim H from 512"):
        NKIGroupedExperts(config)
    monkeypatch.setattr(experts.titan_utils, "device_type", "cpu")
    with pytest.raises(ValueError, match="hidden dim H from 512"):
        NKIGroupedExperts(NKIGroupedExperts.Config(dim=128, hidden_dim=64, num_experts=2, kernel="nki"))
    small = dict(dim=512, hidden_dim=32, num_experts=2, kernel="nki")
    NKIGroupedExperts(NKIGroupedExperts.Config(**small, logical_nc_config=1))  # I 32 fits one core only
    with pytest.raises(ValueError, match=r"I per logical core"):
        NKIGroupedExperts(NKIGroupedExperts.Config(**small, logical_nc_config=2))


@pytest.mark.parametrize("name", ["nki_moe_qwen3_30b_a3b", "nki_moe_qwen3_smoke"])
@pytest.mark.parametrize("lnc", [1, 2])
def test_nki_moe_configs_fit_the_kernels(name, lnc):
    """Both nki_moe configs, full and smoke, have expert shapes both kernels take: what CI runs on CPU is
    the layout the kernels will see."""
    model = getattr(config_registry, name)().model_spec.model
    experts_configs = [layer.moe.routed_experts.inner_experts for layer in model.layers if layer.moe is not None]
    assert experts_configs
    for cfg in experts_configs:
        block = NKIGroupedExperts.Config.__dataclass_fields__["block_size"].default
        nki_kernels.check_kernel_shapes(cfg.dim, cfg.hidden_dim, block, lnc)


# ---- off Neuron --------------------------------------------------------------------------------


def test_kernel_path_selection():
    for value, on_cpu, on_neuron in [
        ("nki", "nki", "nki"),
        ("reference", "reference", "reference"),
        ("auto", "reference", "nki"),
    ]:
        assert (neuron_sdk.kernel_path(value, "cpu"), neuron_sdk.kernel_path(value, "neuron")) == (on_cpu, on_neuron)
    with pytest.raises(ValueError, match="kernel must be one of auto, nki, reference, got 'NKI'"):
        NKIGroupedExperts(NKIGroupedExperts.Config(dim=8, hidden_dim=8, num_experts=2, kernel="NKI"))


def test_the_runs_neuron_settings_reach_the_experts_override():
    """--neuron.moe_kernel and --neuron.logical_nc_config (from NEURON_QWEN3_MOE_KERNEL and the LNC) become the
    override's kwargs; a kwarg the config function set itself (compute_dtype) stays."""
    from neuron_qwen3 import finish

    assert finish.NKI_EXPERTS == f"{experts.__name__}.{experts.nki_grouped_experts.__name__}"
    config = config_registry.nki_moe_qwen3_bench_cpu()
    config.neuron.moe_kernel, config.neuron.logical_nc_config = "reference", 1
    finish.configure_nki_experts(config.override, config.neuron)
    assert config.override.imports == [
        (finish.NKI_EXPERTS, {"kernel": "reference", "logical_nc_config": 1, "compute_dtype": "float32"})
    ]
    plain = config_registry.native_qwen3_smoke()
    finish.configure_nki_experts(plain.override, plain.neuron)
    assert plain.override.imports == []


def test_import_and_cpu_forward_do_not_touch_neuron_packages(tmp_path):
    """Importing the experts and running them on CPU must not import torch_neuronx, nki or nkilib:
    stand-ins for them that fail on import sit first on the path of a fresh interpreter."""
    for package in ("torch_neuronx", "nki", "nkilib"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(f"raise AssertionError('{package} was imported')\n")
    script = textwrap.dedent(
        """
        import sys, torch
        import neuron_qwen3.moe.experts as ne
        cfg = ne.NKIGroupedExperts.Config(dim=8, hidden_dim=8, num_experts=2, block_size=2)
        m = ne.NKIGroupedExperts(cfg)
        for p in m.parameters():
            torch.nn.init.normal_(p)
        m(torch.randn(5, 8), torch.tensor([2, 3])).sum().backward()
        loaded = [name for name in ("torch_neuronx", "nki", "nkilib") if name in sys.modules]
        assert not loaded, loaded
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(RECIPES), str(REPO)])}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_forcing_nki_without_neuron_raises_a_clear_import_error(monkeypatch):
    _, nki = make_pair(512, 64, 2, 256, "bfloat16", kernel="nki")
    run = lambda: nki(torch.randn(6, 512), torch.tensor([4, 2]))  # noqa: E731
    with pytest.raises(ImportError, match=r"'torch_neuronx' is not importable.*NEURON_QWEN3_MOE_KERNEL"):
        run()
    fake = types.ModuleType("torch_neuronx")
    fake.nki_op = fake.wrap_nki = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "torch_neuronx", fake)
    monkeypatch.setitem(sys.modules, "nki", None)  # None in sys.modules: `import nki` raises ImportError
    with pytest.raises(ImportError, match="'nki' is not importable"):
        run()
    monkeypatch.setitem(sys.modules, "nki", types.ModuleType("nki"))
    with pytest.raises(ImportError, match="'nkilib' is not importable"):
        run()


# ---- the NKI path with stand-in Neuron packages ------------------------------------------------


def stand_in_moe_cte(
    hidden_states,
    expert_affinities_masked,
    gate_up_proj_weight,
    down_proj_weight,
    token_position_to_id,
    block_to_expert,
    block_size,
):
    """moe_cte's documented contract (shard_on_i, checkpoints, POST_SCALE), block by block, packed weights."""
    num_experts = gate_up_proj_weight.shape[0]
    out = torch.zeros_like(hidden_states)
    gate_up_act_T, down_act = [], []
    for n in range(block_to_expert.shape[0]):
        e, tokens = int(block_to_expert[n]), token_position_to_id[n * block_size : (n + 1) * block_size].long()
        x = hidden_states[tokens]
        gate, up = x @ gate_up_proj_weight[e, :, 0], x @ gate_up_proj_weight[e, :, 1]
        gate_up_act_T.append(torch.stack([gate.T, up.T]))
        down_act.append((torch.nn.functional.silu(gate) * up) @ down_proj_weight[e])
        affinity = expert_affinities_masked.view(-1, num_experts)[tokens, e].unsqueeze(1)
        out = out.index_add(0, tokens, down_act[-1] * affinity)
    return out, torch.stack(gate_up_act_T), torch.stack(down_act)


def stand_in_neuron_packages(calls: list) -> dict:
    """torch_neuronx, nki and the two nkilib modules, recording how the seam calls them."""

    def jit(mode=None):
        def decorate(fn):
            calls.append(("nki.jit", mode))
            return fn

        return decorate

    class Launch:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                flat = (torch.Tensor, bool, int, float, enum.Enum)
                assert not args and all(isinstance(v, flat) for v in kwargs.values()), (args, kwargs)
                calls.append(("grid", self.kernel.__name__, grid))
                return self.kernel(**kwargs)

            return launch

    Implementation = enum.Enum("MoECTEImplementation", ["shard_on_block", "shard_on_i"])
    ShardOnIConfig = dataclasses.make_dataclass(
        "ShardOnIConfig", [("checkpoint_activation", bool, False), ("expert_affinity_multiply_on_I", bool, False)]
    )
    MoECTESpec = dataclasses.make_dataclass(
        "MoECTESpec", [("implementation", Implementation), ("shard_on_I", ShardOnIConfig, None)]
    )

    def moe_cte(*, spec, **tensors):
        calls.append(("spec", spec))
        assert spec == MoECTESpec(Implementation.shard_on_i, ShardOnIConfig(True, False))
        return stand_in_moe_cte(**tensors)

    def blockwise_mm_bwd(
        *,
        hidden_states,
        expert_affinities_masked,
        gate_up_proj_weight,
        down_proj_weight,
        gate_up_proj_act_checkpoint_T,
        down_proj_act_checkpoint,
        token_position_to_id,
        block_to_expert,
        output_hidden_states_grad,
        block_size,
    ):
        """blockwise_mm_bwd's contract: grads of moe_cte's [T+1, H] output, in the packed layout."""

        def out_of(*inputs):
            return stand_in_moe_cte(*inputs, token_position_to_id, block_to_expert, block_size)[0]

        _, vjp = torch.func.vjp(out_of, hidden_states, expert_affinities_masked, gate_up_proj_weight, down_proj_weight)
        return vjp(output_hidden_states_grad)

    ActFnType = enum.Enum("ActFnType", ["SiLU", "GELU", "GELU_Tanh_Approx", "Swish"])
    ExpertAffinityScaleMode = enum.Enum("ExpertAffinityScaleMode", ["NO_SCALE", "POST_SCALE", "PRE_SCALE"])

    def moe_tkg(*, is_all_expert, expert_affinities_scaling_mode, activation_fn, **tensors):
        calls.append(("moe_tkg", is_all_expert, expert_affinities_scaling_mode.name, activation_fn.name))
        assert (is_all_expert, activation_fn) == (False, ActFnType.SiLU)
        return stand_in_moe_tkg(**tensors, post_scale=expert_affinities_scaling_mode.name == "POST_SCALE")

    modules = {
        name: types.ModuleType(name)
        for name in (
            "torch_neuronx",
            "nki",
            "nkilib",
            "nkilib.core",
            "nkilib.core.moe",
            "nkilib.core.moe.moe_cte",
            "nkilib.core.moe.moe_tkg",
            "nkilib.core.moe.moe_tkg.moe_tkg",
            "nkilib.core.utils",
            "nkilib.core.utils.common_types",
            "nkilib.experimental",
            "nkilib.experimental.moe",
            "nkilib.experimental.moe.bwd",
            "nkilib.experimental.moe.bwd.blockwise_mm_backward",
        )
    }
    modules["torch_neuronx"].nki_op = lambda name, mutates_args: lambda fn: fn
    modules["torch_neuronx"].wrap_nki = Launch
    modules["nki"].jit = jit
    cte = modules["nkilib.core.moe.moe_cte"]
    cte.MoECTEImplementation, cte.MoECTESpec, cte.ShardOnIConfig, cte.moe_cte = (
        Implementation,
        MoECTESpec,
        ShardOnIConfig,
        moe_cte,
    )
    modules["nkilib.experimental.moe.bwd.blockwise_mm_backward"].blockwise_mm_bwd = blockwise_mm_bwd
    modules["nkilib.core.moe.moe_tkg.moe_tkg"].moe_tkg = moe_tkg
    types_module = modules["nkilib.core.utils.common_types"]
    types_module.ActFnType, types_module.ExpertAffinityScaleMode = ActFnType, ExpertAffinityScaleMode
    return modules


def stand_in_moe_tkg(
    hidden_input, expert_gate_up_weights, expert_down_weights, expert_affinities, expert_index, post_scale
):
    """moe_tkg's documented contract with selective experts: each token through each of its K experts (SiLU MLP on
    the packed weights), scaled by its affinity for that expert under POST_SCALE, summed; the inputs it asserts
    (T <= 128, unquantized 16-bit rows and weights, [T, E] affinities, [T, K] int32 indices)."""
    tokens, hidden_dim = hidden_input.shape
    num_experts = expert_gate_up_weights.shape[0]
    assert tokens <= 128 and hidden_input.dtype in (torch.bfloat16, torch.float16)
    assert expert_gate_up_weights.dtype == expert_down_weights.dtype == hidden_input.dtype
    assert expert_affinities.shape == (tokens, num_experts) and expert_affinities.dtype == torch.float32
    assert expert_index.shape[0] == tokens and expert_index.dtype == torch.int32
    out = torch.zeros(tokens, hidden_dim)
    for t in range(tokens):
        for e in expert_index[t].tolist():
            x = hidden_input[t].float()
            gate, up = x @ expert_gate_up_weights[e, :, 0].float(), x @ expert_gate_up_weights[e, :, 1].float()
            down = (torch.nn.functional.silu(gate) * up) @ expert_down_weights[e].float()
            out[t] += down * expert_affinities[t, e] if post_scale else down
    return out.to(hidden_input.dtype)


def test_nki_path_plumbing_with_stand_in_neuron_packages(monkeypatch, titan_in_fp32):
    """Everything of the NKI path but the kernels: the static layout, the call pattern, packing the
    weights, the T+1 rows, unpacking the gradients. The result must equal torchtitan's GroupedExperts."""
    calls = []
    for name, module in stand_in_neuron_packages(calls).items():
        monkeypatch.setitem(sys.modules, name, module)
    counts = torch.tensor([300, 0, 3, 257])  # the smoke MoE's H 512 and I 64, block 256: several blocks, idle expert
    titan, nki = make_pair(512, 64, len(counts), 256, "float32", kernel="nki")  # block_count auto: static on NKI
    assert_same_as_torchtitan(titan, nki, counts, 512, seed=6, out_rel=FP32["output"], grad_rel=FP32["gradients"])
    assert ("nki.jit", "trace") in calls
    assert [c for c in calls if c[0] == "grid"] == [("grid", "moe_cte_training", 2), ("grid", "blockwise_mm_bwd", 2)]
    assert sum(c[0] == "spec" for c in calls) == 1  # built inside the traced function, once per call


def test_stand_in_kernel_keeps_moe_ctes_packed_layout():
    """The stand-in reads the packed weights the way nkilib does: gate_up[e, :, 0] is the gate."""
    gen = torch.Generator().manual_seed(0)
    w1, w3 = torch.randn(2, 8, 4, generator=gen), torch.randn(2, 8, 4, generator=gen)
    w2 = torch.randn(2, 4, 8, generator=gen)
    x = torch.cat([torch.randn(3, 4, generator=gen), torch.zeros(1, 4)])
    affinities = torch.zeros(8, 1)
    affinities[[0 * 2 + 1, 1 * 2 + 1, 2 * 2 + 1]] = 1  # every token to expert 1
    out, _, _ = stand_in_moe_cte(
        x,
        affinities,
        pack_gate_up(w1, w3),
        pack_down(w2),
        torch.tensor([0, 1, 2, 3], dtype=torch.int32),
        torch.tensor([[1]]),
        4,
    )
    expected = (torch.nn.functional.silu(x[:3] @ w1[1].T) * (x[:3] @ w3[1].T)) @ w2[1].T
    torch.testing.assert_close(out[:3], expected)
    assert not out[3].any()


def test_each_lnc_registers_its_own_ops(monkeypatch):
    """torch.library refuses a second op of one name: the kernels built for LNC 2 and LNC 1 in one process (as a
    self-test could) must be three ops each."""
    registered = []

    def nki_op(name, mutates_args):
        assert name not in registered, f"{name} registered twice"
        registered.append(name)
        return lambda fn: fn

    modules = stand_in_neuron_packages([])
    modules["torch_neuronx"].nki_op = nki_op
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    nki_kernels._kernel_ops(2)
    nki_kernels._kernel_ops(1)
    assert len(registered) == 6 and len(set(registered)) == 6


def test_decode_fits_moe_tkgs_limits():
    assert nki_kernels.decode_fits(128, 512, torch.bfloat16, 2) and nki_kernels.decode_fits(1, 384, torch.float16, 1)
    assert not nki_kernels.decode_fits(129, 512, torch.bfloat16, 2)  # T <= 128
    assert not nki_kernels.decode_fits(8, 512, torch.float32, 2)  # 16-bit inputs only
    assert not nki_kernels.decode_fits(8, 384, torch.bfloat16, 2)  # H / 128 split over the LNC's two cores


def test_a_decode_step_runs_moe_tkg_on_its_rows_and_training_the_blockwise_kernels(monkeypatch):
    """Without autograd and with rows moe_tkg takes, the experts are moe_tkg on the rows themselves: torchtitan's
    GroupedExperts' output (bf16), and zero for rows past the counts as in the blockwise path. With autograd, or more
    rows than moe_tkg takes, the same module runs moe_cte."""
    calls = []
    for name, module in stand_in_neuron_packages(calls).items():
        monkeypatch.setitem(sys.modules, name, module)
    counts = torch.tensor([5, 0, 3, 2])  # the smoke MoE's H 512 and I 64; an idle expert
    titan, nki = make_pair(512, 64, len(counts), 256, "bfloat16", kernel="nki")
    x = torch.randn(12, 512, generator=torch.Generator().manual_seed(3))  # 2 rows past the counts
    with torch.no_grad():
        out = nki(x, counts)
        expected = titan(x[:10], counts)
    assert [c[0] for c in calls if c[0] in ("moe_tkg", "grid")] == ["grid", "moe_tkg"]
    assert ("grid", "moe_tkg_decode", 2) in calls and ("moe_tkg", False, "POST_SCALE", "SiLU") in calls
    scale_close(out[:10], expected, BF16["output"])
    assert not out[10:].any() and nki.block_rows == 12

    calls.clear()
    out = nki(x[:10], counts)  # autograd on: the training kernel
    assert ("grid", "moe_cte_training", 2) in calls and not any(c[0] == "moe_tkg" for c in calls)
    scale_close(out.detach(), expected, BF16["output"])
    calls.clear()
    many = torch.tensor([100, 0, 29, 0])
    with torch.no_grad():
        nki(torch.randn(129, 512), many)  # one row more than moe_tkg takes
    assert ("grid", "moe_cte_training", 2) in calls and not any(c[0] == "moe_tkg" for c in calls)


def test_stand_in_moe_tkg_reads_the_packed_layout_and_scales_after_the_expert():
    gen = torch.Generator().manual_seed(0)
    w1, w3, w2 = (torch.randn(shape, generator=gen) for shape in ((2, 8, 4), (2, 8, 4), (2, 4, 8)))
    x = torch.randn(3, 4, generator=gen)
    affinities = torch.tensor([[0.0, 0.5], [0.0, 1.0], [0.0, 2.0]])
    out = stand_in_moe_tkg(
        x.half(), pack_gate_up(w1, w3).half(), pack_down(w2).half(), affinities, torch.ones(3, 1).int(), True
    )
    expected = (torch.nn.functional.silu(x @ w1[1].T) * (x @ w3[1].T)) @ w2[1].T * affinities[:, 1:]
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
