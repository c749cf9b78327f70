"""The simulated `neuron` device (tests/neuron_sim): a PrivateUse1 backend renamed `neuron`, as TorchNeuron
registers on a trn2, on host memory with every operator through ATen's CPU fallback.

Nothing in the project had ever run on a device that is neither CPU nor CUDA; these tests prove the stand-in
behaves like one before anything leans on it. Installing it changes the whole process (PrivateUse1 renamed,
`neuron` the available device type, so torchtitan imported afterwards picks it): the device checks run in a fresh
interpreter (tests/neuron_sim/check_device.py), once for the module, and the tests read its results.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import torchrun

REPO = Path(__file__).resolve().parent.parent
SIM = REPO / "tests" / "neuron_sim"
SITE = SIM / "site"


@pytest.fixture(scope="module", autouse=True)
def build_tools():
    """The device is a C++ extension compiled on first use (torch.utils.cpp_extension): a missing tool fails here
    in one line, as the README's set-up asks for them, instead of skipping the device's proof."""
    missing = [tool for tool in (os.environ.get("CXX", "c++"), "ninja") if not shutil.which(tool)]
    assert not missing, f"the simulated neuron device needs {' and '.join(missing)} to build"


def sim_env(**extra) -> dict:
    """A child's environment with the simulated device loaded at start-up (sitecustomize)."""
    path = os.pathsep.join([str(SITE), str(REPO / "recipes"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return dict(os.environ, NEURON_SIM="1", PYTHONPATH=path, PYTHONUNBUFFERED="1", **extra)


def results(stdout: str) -> list[dict]:
    return [json.loads(line.removeprefix("RESULT ")) for line in stdout.splitlines() if line.startswith("RESULT ")]


@pytest.fixture(scope="module")
def checks() -> dict:
    # The first run in a checkout compiles the extension (about a minute on two busy cores); later runs load it.
    done = subprocess.run(
        [sys.executable, str(SIM / "check_device.py")],
        env=sim_env(),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    found = results(done.stdout)
    assert done.returncode == 0 and found, done.stdout[-3000:] + done.stderr[-3000:]
    return found[0]


def part(checks: dict, name: str) -> dict:
    value = checks[name]
    assert "error" not in value, f"{value['error']}\n{value.get('traceback', '')}"
    return value


def test_device_builds_and_registers_as_neuron(checks):
    installed = part(checks, "install")
    assert installed["installed_at_start"], "the site hook loads the device before the script runs"
    assert installed["backend_name"] == "neuron"
    assert installed["available_device_type"] == "neuron"
    assert installed["accelerator"] == "neuron"
    assert installed["torch_neuron_is_module"]
    assert installed["device_count"] == 8


def test_tensors_round_trip_between_host_and_device(checks):
    trips = part(checks, "round_trip")
    for dtype in ("torch.float32", "torch.bfloat16", "torch.float16", "torch.int64", "torch.int32", "torch.bool"):
        assert trips[dtype] == {
            "device": "neuron:0",
            "equal": True,
            "non_contiguous_equal": True,
            "device_to_device_equal": True,
            "method_equal": True,
        }, dtype
    assert trips["is_neuron"]
    assert trips["view_shares_memory"], "views of a neuron tensor must write through to its storage"


def test_linear_forward_and_backward_on_neuron_equal_cpu_bitwise(checks):
    linear = part(checks, "linear")
    assert linear["loss_device"] == linear["grad_device"] == "neuron:0"
    for name in ("loss", "weight_grad", "bias_grad", "input_grad"):
        assert linear[f"{name}_equal"], (name, linear[f"{name}_max_diff"])


def test_silu_backward_takes_the_decomposition_a_private_device_gets(checks):
    # CPU has a silu_backward kernel; PrivateUse1 runs the CompositeImplicitAutograd decomposition, so gradients
    # agree to rounding, not bitwise (the forward still matches exactly).
    silu = part(checks, "linear_silu")
    assert silu["loss_equal"]
    for name in ("weight_grad", "bias_grad", "input_grad"):
        assert silu[f"{name}_max_diff"] < 1e-6, name


def test_rng_state_is_seed_and_offset_and_round_trips(checks):
    rng = part(checks, "rng")
    assert (rng["dtype"], rng["numel"], rng["device"]) == ("torch.uint8", 16, "cpu")
    assert (rng["seed"], rng["offset"]) == (1234, 0)
    assert rng["offset_after_10"] == 12, "ten numbers move the offset on by 10 rounded up to 4, as Philox"
    assert rng["round_trip_same_numbers"]
    assert rng["other_offset_other_numbers"]
    assert rng["initial_seed"] == 1234
    assert rng["fork_rng_restores"]
    assert rng["torch_manual_seed_reaches_device"]


def test_device_module_answers_torchtitan(checks):
    module = part(checks, "device_module")
    assert module["peak_grew_by"] >= 4 * 1024 * 1024
    assert module["after_free"] < 1024
    for key in ("active_bytes.all.peak", "reserved_bytes.all.peak", "num_alloc_retries", "num_ooms"):
        assert key in module["stats_keys"]
    assert module["name"] == "trn2"  # what torchtitan's get_peak_flops matches
    assert module["total_memory"] == 24 * 1024**3
    assert "neuron" in module["device_name"]
    assert module["event_done"]
    assert module["storage_resized"] == [0, 64]
    assert module["autocast"] == ["torch.bfloat16", "torch.float32"]  # matmul cast, add left alone
    for name in (
        "get_rng_state",
        "memory_stats",
        "reset_peak_memory_stats",
        "Stream",
        "Event",
        "get_amp_supported_dtype",
    ):
        assert module["calls"].get(name, 0) >= 1, name


def test_op_recorder_counts_the_operators_on_the_device(checks):
    recorded = part(checks, "recorder")
    assert recorded["mode"] == {
        "aten.mm.default|bfloat16,bfloat16": 1,
        "aten.relu.default|bfloat16": 1,
        "aten.sum.default|bfloat16": 1,
        "aten._local_scalar_dense.default|bfloat16": 1,
    }
    census = recorded["census"]
    assert census["aten::mm.out(BFloat16,BFloat16,BFloat16)"] == 1
    assert census["aten::relu(BFloat16)"] == 1
    assert census["aten::normal_(BFloat16)"] == 1  # torch.randn on the device


def test_inductor_fails_on_neuron_as_on_trainium(checks):
    inductor = part(checks, "inductor")
    assert inductor["raised"], "Inductor compiled a function for the neuron device"
    assert inductor["type"] == "torch._inductor.exc.InductorError"
    assert inductor["message"].startswith("KeyError: 'neuron'"), inductor["message"]  # get_device_op_overrides
    reduction = part(checks, "inductor_reduction")
    assert reduction["raised"], "Inductor compiled a reduction for the neuron device"
    assert reduction["type"] == "torch._inductor.exc.InductorError"
    assert reduction["message"].startswith(
        "LoweringException: AssertionError: no scheduling registered for device neuron"
    ), reduction["message"]


def test_torchtitan_picks_neuron_when_the_sim_loads_at_start_up():
    code = (
        "import json, torch, torchtitan.tools.utils as u;"
        "print('RESULT ' + json.dumps([u.device_type, u.device_module.__name__, torch.neuron.is_available(),"
        " u.get_peak_flops(torch.neuron.get_device_name())]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=sim_env(), capture_output=True, text=True, timeout=600, cwd=REPO
    )
    assert results(done.stdout) == [["neuron", "neuron_sim.device_module", True, 79e12 * 2]], done.stderr[-3000:]


def two_ranks(script: str, *args: str) -> list[dict]:
    """Each rank's result of a tests/neuron_sim script run by torchrun on 2 ranks with the device loaded."""
    command = [*torchrun(2), str(SIM / script), *args]
    done = subprocess.run(command, env=sim_env(), capture_output=True, text=True, timeout=600, cwd=REPO)
    ranks = sorted(results(done.stdout), key=lambda r: r["rank"])
    assert done.returncode == 0 and len(ranks) == 2, done.stdout[-3000:] + done.stderr[-3000:]
    return ranks


@pytest.mark.training
def test_neuron_process_group_sums_across_two_ranks():
    ranks = two_ranks("check_collectives.py")
    for rank in ranks:
        # c10d names any plugin backend's type "custom"
        assert (rank["backend"], rank["backend_name"], rank["devices"]) == ("neuron", "custom", ["neuron"])
        assert rank["all_reduce"] == [3.0] * 4  # 1 + 2
        assert rank["avg_bf16"] == [1.5] * 2
        assert rank["all_gather"] == [0.0, 0.0, 1.0, 1.0]
        assert rank["broadcast"] == [1.0] * 3
        assert rank["functional"] == [2.0] * 3
        assert [c[0] for c in rank["collectives"]] == [
            "allreduce",
            "allreduce",
            "all_gather_into_tensor",
            "reduce_scatter_tensor",
            "reduce_scatter_tensor",
            "broadcast",
            "barrier",
            "allreduce",
        ]
        assert rank["collectives"][1] == ["allreduce", "bfloat16", 2, "AVG"]
        assert rank["collectives"][4] == ["reduce_scatter_tensor", "float32", 4, "PREMUL_SUM"]
    assert [r["reduce_scatter"] for r in ranks] == [[0.0, 2.0], [4.0, 6.0]]
    assert [r["premul_sum"] for r in ranks] == [[0.0, 1.0], [2.0, 3.0]]


@pytest.mark.training
@pytest.mark.parametrize("mode", ["upstream", "patched"])
def test_host_tensor_collectives_need_the_neuron_adapters_gloo(mode):
    """torchtitan's group on Neuron is the device's backend alone, which (like TorchNeuron's) takes no host tensors;
    quirks/neuron_adapter.py adds gloo for them, and object collectives (DCP's save plan) then go through gloo."""
    for rank in two_ranks("check_host_collectives.py", mode):
        if mode == "upstream":
            assert rank["devices"] == ["neuron"]
            assert rank["error"] == "No backend type associated with device type cpu"
        else:
            assert rank["devices"] == ["cpu", "neuron"]
            assert rank["host_all_reduce"] == [2.0, 2.0]
            assert rank["gathered"] == ([{"rank": 0}, {"rank": 1}] if rank["rank"] == 0 else None)
