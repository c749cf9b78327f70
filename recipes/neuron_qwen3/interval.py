"""A logging interval's figures by name, reduced over the ranks once: how every watcher and the generator report.

A watcher adds each micro-step's figures where they were computed (on the device: no host sync); at a logged step
`reduced()` runs one all-reduce per kind of reduction over the group and copies the result to the host once. Every
rank of the group must add the same names in the same order, as for any collective. Counts (ints, integer
tensors) stay int64 and everything else is float64, so the device runs the dtypes it ran before: the simulated
device's census (docs/neuron-ops.md) counts every new one.
"""

import itertools

import torch
import torch.distributed as dist

OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "kept": None}
DTYPES = (torch.int64, torch.float64)


def figure(value) -> torch.Tensor:
    value = torch.as_tensor(value)
    return value.to(torch.float64 if value.is_floating_point() else torch.int64)


class IntervalSums:
    def __init__(self, group=None, device=None):
        """`group`: the ranks to reduce over (None: this process alone); `device`: where the reduction runs, as the
        process group's backend may not take host tensors (None: the first figure's device)."""
        self.group, self.device = group, device
        self.figures = {}  # name -> [float64 tensor, how the ranks' values combine]

    def add(self, across: str = "sum", **figures) -> None:
        """Each figure (a number or a tensor) summed over the interval, and over the ranks `across`: "sum", "max"
        (the slowest rank's seconds, say) or "kept" (each rank holds the group's value already)."""
        assert across in OPS, f"across {across!r} is not one of {', '.join(OPS)}"
        for name, value in figures.items():
            value = figure(value)
            if name in self.figures:
                assert self.figures[name][1] == across, f"{name}: added as {self.figures[name][1]}, now as {across}"
                self.figures[name][0] = self.figures[name][0] + value
            else:
                self.figures[name] = [value, across]

    def most(self, **figures) -> None:
        """Each figure's largest value over the interval and over the ranks."""
        for name, value in figures.items():
            value = figure(value)
            kept = self.figures.get(name)
            assert kept is None or kept[1] == "max", f"{name}: added as {kept[1]}, now as a maximum"
            self.figures[name] = [value if kept is None else torch.maximum(kept[0], value), "max"]

    def __bool__(self) -> bool:
        return bool(self.figures)

    def reduced(self) -> dict:
        """The interval's figures over the group, on the host: a number each (an int for a count), a tensor for a
        vector. The next interval starts empty. A collective: every rank of the group calls it."""
        figures, self.figures = self.figures, {}
        found = {}
        for (across, op), dtype in itertools.product(OPS.items(), DTYPES):
            names = [name for name, (value, kind) in figures.items() if kind == across and value.dtype == dtype]
            if not names:
                continue
            parts = [figures[name][0].reshape(-1) for name in names]
            flat = torch.cat([part.to(parts[0].device) for part in parts])  # where they are: one copy at most
            if op is not None and self.group is not None:
                flat = flat.to(self.device or flat.device)
                dist.all_reduce(flat, op=op, group=self.group)
            flat, start = flat.cpu(), 0
            for name in names:
                shape = figures[name][0].shape
                part = flat[start : start + shape.numel()].reshape(shape)
                found[name] = part.item() if part.dim() == 0 else part
                start += shape.numel()
        return found
