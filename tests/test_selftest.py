"""The trn2 self-test's plumbing, off Neuron: verdict lines, the first failure's exit, the off-Neuron exit 2,
the kernel comparisons (with the stand-in Neuron packages of test_nki_kernels.py and test_attention_nki.py), the
per-LNC child checks and the native-steps verdict.

Run: .venv/bin/python -m pytest tests/test_selftest.py -q

What needs a Trainium (a real NeuronCore, the real kernels, the LNC child processes, native steps on a core)
cannot run here; the self-test is that check, for the first person with a trn2.
"""

import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO, launcher_at
from test_attention_nki import stand_in_neuron_packages as stand_in_attention_packages
from test_nki_kernels import stand_in_neuron_packages

from entrypoint import cli, contract
from neuron_qwen3 import config_registry
from neuron_qwen3.attention import nki_kernels as attention_kernels
from neuron_qwen3.prelaunch import selftest
from neuron_qwen3.moe import nki_kernels


def test_off_neuron_the_launcher_says_so_and_exits_2(tmp_path):
    (tmp_path / "dev").mkdir()
    result = subprocess.run(
        launcher_at(tmp_path, "--self-test"), env=os.environ, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout.splitlines() == [result.stdout.strip()] and "this is not a Trainium host" in result.stdout
    assert "torch" not in result.stderr


def test_devices_verdict_from_the_launchers_discovery_then_the_child(tmp_path, capsys, monkeypatch):
    (tmp_path / "dev").mkdir()
    for n in range(2):
        (tmp_path / "dev" / f"neuron{n}").touch()
    ran = []
    monkeypatch.setattr(cli.launch, "run", lambda argv, env, grace: ran.append(argv) or 0)
    assert cli.self_test(contract.parse({}), {}, str(tmp_path)) == 0
    assert capsys.readouterr().out == "self-test: PASS devices: 2 Neuron devices, 8 logical NeuronCores at LNC 2\n"
    assert ran == [[sys.executable, "-m", "neuron_qwen3.prelaunch.selftest"]]


def test_one_line_per_check_and_the_first_failure_stops(capsys):
    ran = []

    def broken():
        ran.append("broken")
        raise selftest.Failed("error 3.0e-01 (tolerance 0.01)\nsecond line")

    checks = [("first", lambda: "fine"), ("second", broken), ("third", lambda: ran.append("third"))]
    assert selftest.run_checks(checks) == 1
    assert capsys.readouterr().out.splitlines() == [
        "self-test: PASS first: fine",
        "self-test: FAIL second: error 3.0e-01 (tolerance 0.01)",
    ]
    assert ran == ["broken"]
    assert selftest.run_checks([("a", lambda: "x"), ("b", lambda: "y")]) == 0


def test_off_neuron_the_child_fails_at_the_runtime_with_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "neuron_qwen3.prelaunch.selftest"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    [line] = result.stdout.splitlines()
    assert line.startswith("self-test: FAIL runtime: torch_neuronx is not importable"), line


@pytest.fixture
def stand_in_kernels(monkeypatch):
    calls = []
    for name, module in stand_in_neuron_packages(calls).items():
        monkeypatch.setitem(sys.modules, name, module)
    nki_kernels._kernel_ops.cache_clear()
    yield sys.modules["nkilib.core.moe.moe_cte"]
    nki_kernels._kernel_ops.cache_clear()


def test_kernel_comparison_passes_within_the_cpu_tolerances(stand_in_kernels):
    verdict = selftest.compare_kernels(selftest.SHAPES[0], "cpu")  # kernel nki: through the stand-ins on CPU
    assert verdict.startswith("H=512 I=64 E=4 B=256: output error ") and "(tolerance 0.01)" in verdict


def test_kernel_comparison_fails_on_a_wrong_kernel(stand_in_kernels, monkeypatch):
    right = stand_in_kernels.moe_cte

    def off_by_five_percent(**kwargs):
        out, gate_up, down = right(**kwargs)
        return out * 1.05, gate_up, down

    monkeypatch.setattr(stand_in_kernels, "moe_cte", off_by_five_percent)
    with pytest.raises(selftest.Failed, match=r"output error 5\.\de-02 \(tolerance 0.01\)"):
        selftest.compare_kernels(selftest.SHAPES[0], "cpu")


def test_decode_comparison_passes_and_fails_on_a_wrong_kernel(stand_in_kernels, monkeypatch):
    rows = selftest.DECODE_SLOTS * selftest.SHAPES[0].top_k
    verdict = selftest.compare_decode(selftest.SHAPES[0], "cpu")  # moe_tkg through the stand-ins on CPU
    assert verdict.startswith(f"decode H=512 I=64 E=4 {rows} rows: output error ") and "(tolerance 0.01)" in verdict
    module = sys.modules["nkilib.core.moe.moe_tkg.moe_tkg"]
    right = module.moe_tkg
    monkeypatch.setattr(module, "moe_tkg", lambda **kwargs: right(**kwargs) * 1.05)
    nki_kernels._kernel_ops.cache_clear()  # the op took the kernel from its module when it was built
    with pytest.raises(selftest.Failed, match=r"output error (4\.9|5\.\d)e-02 \(tolerance 0.01\)"):
        selftest.compare_decode(selftest.SHAPES[0], "cpu")


def test_every_moe_shape_fits_the_decode_kernel_at_each_lnc():
    for shape in selftest.SHAPES:
        for lnc in selftest.LNC_ORDER:
            assert nki_kernels.decode_fits(selftest.DECODE_SLOTS * shape.top_k, shape.dim, torch.bfloat16, lnc)


@pytest.fixture
def stand_in_attention(monkeypatch):
    calls = []
    for name, module in stand_in_attention_packages(calls).items():
        monkeypatch.setitem(sys.modules, name, module)
    attention_kernels._kernel_ops.cache_clear()
    yield sys.modules["nkilib.core.attention.attention_cte"], sys.modules["nkilib.core.attention.attention_bwd"]
    attention_kernels._kernel_ops.cache_clear()


def test_attention_shapes_fit_the_kernels():
    """The smoke window is the smoke configs' seq_len, and every window is one both kernels take at both LNCs."""
    assert sum(selftest.ATTENTION_SHAPES[0].documents[0]) == config_registry.native_qwen3_smoke().training.seq_len
    for shape in selftest.ATTENTION_SHAPES:
        [length] = {sum(row) for row in shape.documents}
        assert len(shape.documents[0]) > 1 and any(n % 128 for row in shape.documents for n in row)
        for lnc in selftest.LNC_ORDER:
            attention_kernels.check_kernel_shapes(shape.head_dim, length, lnc)


def test_attention_comparison_passes_within_the_tolerances(stand_in_attention):
    verdict = selftest.compare_attention(selftest.ATTENTION_SHAPES[0], "cpu")  # through the stand-ins on CPU
    assert verdict.startswith("D=32 Hq=4 Hkv=2 L=256 documents 100+37+119, 256: output error "), verdict
    assert "(tolerance 0.02), lse " in verdict and "gradients " in verdict and "(tolerance 0.03)" in verdict


def _off_by_five_percent_output(cte, bwd):
    def wrong(**kwargs):
        out, neg_max, sum_recip = cte(**kwargs)
        return out * 1.05, neg_max, sum_recip

    return wrong, bwd


def _lse_off_by_005(cte, bwd):
    def wrong(**kwargs):
        out, neg_max, sum_recip = cte(**kwargs)
        return out, neg_max - 0.05, sum_recip

    return wrong, bwd


def _dv_off_by_five_percent(cte, bwd):
    def wrong(**kwargs):
        dq, dk, dv = bwd(**kwargs)
        return dq, dk, dv * 1.05

    return cte, wrong


WRONG_ATTENTION = {
    "output": (_off_by_five_percent_output, r"output error 5\.\de-02 \(tolerance 0.02\)"),
    "lse": (_lse_off_by_005, r"lse 5\.\de-02 \(tolerance 0.02\)"),
    "dv": (_dv_off_by_five_percent, r"gradients 5\.\de-02 \(tolerance 0.03\)"),
}


@pytest.mark.parametrize("wrong", list(WRONG_ATTENTION))
def test_attention_comparison_fails_on_a_wrong_kernel(stand_in_attention, monkeypatch, wrong):
    cte_module, bwd_module = stand_in_attention
    breaking, message = WRONG_ATTENTION[wrong]
    cte, bwd = breaking(cte_module.attention_cte, bwd_module.attention_bwd)
    monkeypatch.setattr(cte_module, "attention_cte", cte)
    monkeypatch.setattr(bwd_module, "attention_bwd", bwd)
    with pytest.raises(selftest.Failed, match=message):
        selftest.compare_attention(selftest.ATTENTION_SHAPES[0], "cpu")


def test_each_kernel_family_runs_at_each_lnc_in_a_child(monkeypatch, capsys):
    assert [name for name, _ in selftest.CHECKS] == [
        "runtime",
        "nki_moe LNC 2",
        "nki_moe LNC 1",
        "attention LNC 2",
        "attention LNC 1",
        "native",
    ]
    ran = []

    def child(argv, env, capture_output, text):
        ran.append((argv[-2:], env["NEURON_LOGICAL_NC_CONFIG"]))
        line = "self-test: FAIL attention LNC 1: boom" if argv[-1] == "1" else "self-test: PASS attention LNC 2: fine"
        return subprocess.CompletedProcess(argv, 0 if argv[-1] == "2" else 1, stdout=line + "\n", stderr="")

    monkeypatch.setattr(selftest.subprocess, "run", child)
    assert selftest.check_kernels(2, "attention") == "fine"
    with pytest.raises(selftest.Failed, match=r"the LNC 1 attention checks stopped \(exit 1\): boom"):
        selftest.check_kernels(1, "attention")
    assert ran == [(["attention", "2"], "2"), (["attention", "1"], "1")]

    monkeypatch.setitem(selftest.CHILD_CHECKS, "attention", lambda lnc: f"ran at LNC {lnc}")
    assert selftest.main(["attention", "1"]) == 0
    assert capsys.readouterr().out == "self-test: PASS attention LNC 1: ran at LNC 1\n"


def test_native_verdict():
    good = "step:  1  loss:  7.5\nstep:  2  loss:  7.1\x1b[0m\nstep:  3  loss:  6.9\n"
    assert selftest.native_verdict(0, good, 3) == "losses 7.500, 7.100, 6.900"
    for code, output in [(1, good), (0, good.replace("6.9", "nan")), (0, "step:  1  loss:  7.5\nboom")]:
        with pytest.raises(selftest.Failed, match="exit"):
            selftest.native_verdict(code, output, 3)
