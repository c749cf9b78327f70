"""The Neuron worker imports torch_neuronx before torchtitan, so torchtitan selects the `neuron` device.

Run: .venv/bin/python -m pytest tests/test_neuron_worker.py -q

A stand-in `torch_neuronx` (what TorchNeuron does at import: a PrivateUse1 backend renamed `neuron` with a
`torch.neuron` device module) records whether torchtitan was already imported; a stand-in trainer main records
the device torchtitan picked. Each case runs in a fresh interpreter: device selection is process-global.
"""

import os
import subprocess
import sys
import textwrap

from conftest import REPO, RECIPES

STAND_IN = textwrap.dedent(
    """
    import sys, types, torch
    TORCHTITAN_FIRST = any(name == "torchtitan" or name.startswith("torchtitan.") for name in sys.modules)
    torch.utils.rename_privateuse1_backend("neuron")
    device = types.ModuleType("torch.neuron")
    device.is_available = lambda: True
    device.device_count = lambda: 1
    torch._register_device_module("neuron", device)
    """
)

# Runs the worker as `python -m neuron_qwen3.neuron_worker` would, with neuron_qwen3.trainer replaced by a probe
# that imports torchtitan when it is imported, as the real one does (torchtitan then picks its device).
DRIVER = textwrap.dedent(
    """
    import importlib.abc, importlib.util, runpy, sys

    class ProbeTrainer(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            return importlib.util.spec_from_loader(name, self) if name == "neuron_qwen3.trainer" else None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            from torchtitan.tools import utils

            def main():
                first = getattr(sys.modules.get("torch_neuronx"), "TORCHTITAN_FIRST", "not imported")
                print(f"torchtitan first: {first}; device: {utils.device_type}")
            module.main = main

    sys.meta_path.insert(0, ProbeTrainer())
    runpy.run_module("neuron_qwen3.neuron_worker", run_name="__main__")
    """
)


def run_worker(tmp_path, with_torch_neuronx: bool) -> subprocess.CompletedProcess:
    if with_torch_neuronx:
        (tmp_path / "torch_neuronx.py").write_text(STAND_IN)
    else:  # None in sys.modules: `import torch_neuronx` raises ImportError, as where it is not installed
        (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['torch_neuronx'] = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(RECIPES), str(REPO)])}
    return subprocess.run([sys.executable, "-c", DRIVER], env=env, capture_output=True, text=True, timeout=120)


def test_torch_neuronx_comes_first_and_torchtitan_selects_neuron(tmp_path):
    result = run_worker(tmp_path, with_torch_neuronx=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "torchtitan first: False; device: neuron"


def test_without_torch_neuronx_it_stops_with_one_line(tmp_path):
    result = run_worker(tmp_path, with_torch_neuronx=False)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(
        "neuron worker: torch_neuronx is not importable"), result.stderr
