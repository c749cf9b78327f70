"""The worker's device set-up (recipes/neuron_qwen3/quirks/devices.py), first thing in the project's trainers.

Stock `python -m torchtitan.train` imports torchtitan's trainer, which picks its device and copies the choice into
several modules, before any recipe runs. A stand-in `torch_neuronx` (what TorchNeuron does at import: a PrivateUse1
backend renamed `neuron` with a `torch.neuron` device module) shows that set_up("neuron") makes torchtitan train on
`neuron` everywhere anyway; each case runs in a fresh interpreter (device selection is process-global).
Run: .venv/bin/python -m pytest tests/test_devices.py -q
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.training  # each case starts an interpreter that imports torchtitan
STAND_IN = textwrap.dedent(
    """
    import types, torch
    torch.utils.rename_privateuse1_backend("neuron")
    device = types.ModuleType("torch.neuron")
    device.is_available = lambda: True
    device.device_count = lambda: 1
    torch._register_device_module("neuron", device)
    """
)
PROBE = textwrap.dedent(
    """
    import sys
    import torchtitan.trainer  # as stock torchtitan.train: the device is picked and copied here
    import torchtitan.distributed.parallel_dims as copied
    from torchtitan.tools import utils
    from neuron_qwen3.quirks import devices
    picked = utils.device_type
    kind = devices.set_up(sys.argv[1])
    print(f"picked {picked}; set up {kind}; torchtitan {utils.device_type}; copied {copied.device_type}")
    """
)


def set_up(tmp_path, kind, with_torch_neuronx) -> subprocess.CompletedProcess:
    if with_torch_neuronx:
        (tmp_path / "torch_neuronx.py").write_text(STAND_IN)
    else:  # None in sys.modules: `import torch_neuronx` raises ImportError, as where it is not installed
        (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['torch_neuronx'] = None\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", PROBE, kind], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("kind", ["neuron", "auto"])
def test_torch_neuronx_after_torchtitan_still_trains_on_neuron(tmp_path, kind):
    result = set_up(tmp_path, kind, with_torch_neuronx=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "picked cuda; set up neuron; torchtitan neuron; copied neuron"


def test_without_torch_neuronx_auto_is_the_cpu_and_neuron_one_line(tmp_path):
    auto = set_up(tmp_path, "auto", with_torch_neuronx=False)
    assert auto.returncode == 0, auto.stderr[-2000:]
    assert auto.stdout.strip() == "picked cuda; set up cpu; torchtitan cpu; copied cpu"
    neuron = set_up(tmp_path, "neuron", with_torch_neuronx=False)
    assert neuron.returncode == 1 and neuron.stdout == ""
    assert neuron.stderr.strip().splitlines() == [
        "neuron_qwen3: device neuron, but no neuron device is registered and torch_neuronx is not importable: "
        "run the Neuron image on a Trainium host"
    ]
