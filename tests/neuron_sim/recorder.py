"""Recording what a run asks of the simulated device, for a census.

Two views of the operators:
- `census()`: every ATen operator that reached the device's dispatch key (the C++ fallback and the device's own
  kernels count them, always on), as "name.overload(dtypes of the tensor inputs)" -> calls. Composite operators
  appear as what they decompose into, and the host copies the fallback makes appear as `_copy_from`/`empty`.
- `OpRecorder`: a TorchDispatchMode that counts, per ATen overload and input dtypes, the calls that touch a
  neuron tensor or create one, as the program issued them (before the fallback's copies).

`dump(path)` writes both counters, the device-module calls and the collectives to one JSON file; `install()`
arranges it at exit when NEURON_SIM_REPORT names a folder (one file per rank). `Phases` splits the same records by
phase of a training run (census_run.py).
"""

import functools
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


OUTSIDE = "rest of the run"  # what no phase claims: set-up, the checkpoint's load, the close


class Phases:
    """The census, the device-module calls and the collectives split by phase of a run: each call of a wrapped
    method is its phase; what happens outside every phase is OUTSIDE. A phase inside another is its own."""

    def __init__(self):
        self.records: dict = {}
        self.stack = [OUTSIDE]
        self.mark = self._now()

    def _now(self):
        return Counter(census()), Counter(device_module.CALLS), len(process_group.COLLECTIVES)

    def _flush(self) -> None:
        ops, calls, collectives = self._now()
        record = self.records.setdefault(self.stack[-1], {"ops": Counter(), "calls": Counter(), "collectives": set()})
        record["ops"] += ops - self.mark[0]
        record["calls"] += calls - self.mark[1]
        record["collectives"].update(tuple(c[:2] + c[3:]) for c in process_group.COLLECTIVES[self.mark[2] :])
        self.mark = (ops, calls, collectives)

    def wrap(self, owner, name: str, phase: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def in_phase(*args, **kwargs):
            self._flush()
            self.stack.append(phase)
            try:
                return original(*args, **kwargs)
            finally:
                self._flush()
                self.stack.pop()

        setattr(owner, name, in_phase)

    def dump(self, path) -> Path:
        """One JSON file: for each phase, its operators, device-module functions and collectives (name, dtype,
        reduction), without counts."""
        self._flush()
        record = {
            phase: {
                "ops": sorted(r["ops"]),
                "calls": sorted(r["calls"]),
                "collectives": sorted(list(c) for c in r["collectives"]),
            }
            for phase, r in self.records.items()
        }
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1, sort_keys=True))
        return path
