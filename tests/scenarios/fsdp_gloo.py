"""FSDP2 with torchtitan's gradient-division setting over gloo, two ranks; prints "grad ok".

argv[1]: "patched" applies the CPU adapter, "upstream" does not; torchtitan is imported first either way. Run under
torchrun.
"""

import sys

import torch
import torch.distributed as dist

import torchtitan.experiments.transformers_modeling_backend.parallelize as hf_parallelize
from torch.distributed.fsdp import fully_shard

from neuron_qwen3.run import teardown

if sys.argv[1] == "patched":
    from neuron_qwen3.quirks import cpu_adapter

    cpu_adapter.activate()

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
fully_shard(model)
hf_parallelize.disable_fsdp_gradient_division(model)  # the copy a parallelize module imported by name
model(torch.randn(4, 8)).sum().backward()
print(f"grad ok rank={dist.get_rank()}")
teardown.destroy_process_groups()  # and the FSDP state's reference cycle, which holds the group (teardown.py)
