"""Recording what a run asks of the simulated device, for a census.

Two views of the operators:
- `census()`: every ATen operator that reached the device's dispatch key (the C++ fallback and the device's own
  kernels count them, always on), as "name.overload(dtypes of the tensor inputs)" -> calls. Composite operators
  appear as what they decompose into, and the host copies the fallback makes appear as `_copy_from`/`empty`.
- `OpRecorder`: a TorchDispatchMode that counts, per ATen overload and input dtypes, the calls that touch a
  neuron tensor or create one, as the program issued them (before the fallback's copies).

`dump(path)` writes both counters, the device-module calls and the collectives to one JSON file; `install()`
arranges it at exit when NEURON_SIM_REPORT names a folder (one file per rank).
"""

import json
import os
from collections import Counter
from pathlib import Path

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from . import device_module, process_group

_ext = None  # set by neuron_sim.install()


def census() -> dict[str, int]:
    return dict(_ext.census())


def reset() -> None:
    """Forget the operator census, the device-module calls and the collectives recorded so far."""
    _ext.reset_census()
    device_module.CALLS.clear()
    process_group.COLLECTIVES.clear()


def _on_device(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.device.type == "neuron"
    if isinstance(value, torch.device | str):
        try:
            return torch.device(value).type == "neuron"
        except (RuntimeError, TypeError):
            return False
    return False


class OpRecorder(TorchDispatchMode):
    """Counts the ATen operators that touch the neuron device: `counts[(overload, dtypes)]`."""

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = pytree.arg_tree_leaves(*args, **kwargs)
        if any(_on_device(leaf) for leaf in leaves) or _on_device(kwargs.get("device")):
            dtypes = tuple(str(x.dtype).removeprefix("torch.") for x in leaves if isinstance(x, torch.Tensor))
            self.counts[(str(func), dtypes)] += 1
        return func(*args, **kwargs)

    def names(self) -> Counter:
        """Calls per ATen overload, whatever the dtypes."""
        names: Counter = Counter()
        for (name, _), n in self.counts.items():
            names[name] += n
        return names


def dump(path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "census": census(),
        "device_module_calls": dict(device_module.CALLS),
        "collectives": [list(c) for c in process_group.COLLECTIVES],
    }
    path.write_text(json.dumps(record, indent=1, sort_keys=True))
    return path


def dump_at_exit(folder) -> None:
    rank = os.environ.get("RANK", "0")
    dump(Path(folder) / f"rank{rank}-pid{os.getpid()}.json")
