"""The worker's device, set up first thing in the project's trainers: Neuron, CUDA or CPU.

torchtitan 0.3.0 picks its device once, when `torchtitan.tools.utils` is imported
(`device_type = _get_available_device_type() or "cuda"`), and several of its modules copy the choice by name
(`from torchtitan.tools.utils import device_type`). Stock `python -m torchtitan.train` imports its trainer before
these recipes, so the choice is made before any of our code runs: "cuda" on a CPU host, and "cuda" on a Neuron host
whose torch has not imported torch_neuronx yet. `set_up` (trainer.RunHooks.__init__, before the trainer touches a
device) makes the choice right and rebinds it in every torchtitan module that copied it.

This module and the topology torchrun gives each worker are the only things in the recipes that read the process
environment.
"""

import os
import sys

import torch

KINDS = ("auto", "neuron", "cuda", "cpu")


def rebind(home, name: str, value) -> None:
    """Set `home.<name>` and the same name in every loaded torchtitan module that imported the old value."""
    old = getattr(home, name)
    for module_name, module in list(sys.modules.items()):
        if module is not None and module_name.split(".")[0] == "torchtitan" and getattr(module, name, None) is old:
            setattr(module, name, value)


def _neuron_registered() -> bool:
    """Is `neuron` a device of this process? TorchNeuron registers it when torch is imported (PyTorch's backend
    autoload); otherwise importing torch_neuronx does. False where neither has."""
    if torch._utils._get_available_device_type() == "neuron":
        return True
    try:
        import torch_neuronx  # noqa: F401
    except ImportError:
        return False
    return torch._utils._get_available_device_type() == "neuron"


def found() -> str:
    """DEVICE=auto as the launcher's discovery decides it, from inside the worker: Neuron, else CUDA, else CPU."""
    if _neuron_registered():
        return "neuron"
    return "cuda" if torch.cuda.is_available() else "cpu"


def set_up(kind: str) -> str:
    """Make torchtitan train on `kind` (one of KINDS) in this process; returns the kind."""
    assert kind in KINDS, f"device {kind!r} is not one of {', '.join(KINDS)}"
    kind = found() if kind == "auto" else kind
    import torchtitan.tools.utils as tt_utils

    if kind == "neuron":
        if not _neuron_registered():
            sys.exit(
                "neuron_qwen3: device neuron, but no neuron device is registered and torch_neuronx is not "
                "importable: run the Neuron image on a Trainium host"
            )
        rebind(tt_utils, "device_type", "neuron")
        rebind(tt_utils, "device_module", torch._utils._get_device_module("neuron"))
        from neuron_qwen3.quirks import neuron_adapter

        neuron_adapter.activate()
    elif kind == "cpu":
        from neuron_qwen3.quirks import cpu_adapter

        cpu_adapter.activate()
    return kind


def environment(**changes) -> dict:
    """This process's environment with `changes`: for the self-test's children (the runtime reads the LNC)."""
    return {**os.environ, **changes}


def processes_per_node(world_size: int) -> int:
    """torchrun's LOCAL_WORLD_SIZE (this worker's node), for the report's node count; `world_size` without one."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world_size))


def torchrun_error_file() -> str | None:
    """torchrun's TORCHELASTIC_ERROR_FILE: where a worker records its failure for torchrun's failure table."""
    return os.environ.get("TORCHELASTIC_ERROR_FILE")
