"""The trn2 self-test's plumbing, off Neuron: verdict lines, the first failure's exit, the off-Neuron exit 2,
the kernel comparison (with the stand-in Neuron packages of test_nki_kernels.py) and the native-steps verdict.

Run: .venv/bin/python -m pytest tests/test_selftest.py -q

What needs a Trainium (a real NeuronCore, the real kernels, the LNC child processes, native steps on a core)
cannot run here; the self-test is that check, for the first person with a trn2.
"""

import os
import subprocess
import sys

import pytest

from conftest import REPO, launcher_at
from test_nki_kernels import stand_in_neuron_packages

from entrypoint import cli, contract
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


def test_native_verdict():
    good = "step:  1  loss:  7.5\nstep:  2  loss:  7.1\x1b[0m\nstep:  3  loss:  6.9\n"
    assert selftest.native_verdict(0, good, 3) == "losses 7.500, 7.100, 6.900"
    for code, output in [(1, good), (0, good.replace("6.9", "nan")), (0, "step:  1  loss:  7.5\nboom")]:
        with pytest.raises(selftest.Failed, match="exit"):
            selftest.native_verdict(code, output, 3)
