"""IntervalSums on this torchrun's gloo ranks: two micro-steps of each kind of figure, then one reduction; rank 0
prints the reduced figures and the sizes of the all-reduces it ran, as JSON."""

import json

import torch
import torch.distributed as dist

from neuron_qwen3.interval import IntervalSums
from neuron_qwen3.run import teardown

dist.init_process_group("gloo")
rank = dist.get_rank()
calls = []
all_reduce = dist.all_reduce
dist.all_reduce = lambda tensor, **kwargs: (calls.append(tensor.numel()), all_reduce(tensor, **kwargs))[1]
sums = IntervalSums(dist.group.WORLD)
for step in range(2):
    sums.add(tokens=rank + 1.0, load=torch.tensor([rank, 10.0 * step]))
    sums.add(across="max", seconds=1.0 + rank)
    sums.add(across="kept", rows=7.0)
    sums.most(widest=3.0 * rank + step)
found = sums.reduced()
if rank == 0:
    print(json.dumps({k: v if isinstance(v, float) else v.tolist() for k, v in found.items()} | {"calls": calls}))
del sums  # it holds the group
teardown.destroy_process_groups()  # before finalization, where gloo's threads can abort the process (teardown.py)
