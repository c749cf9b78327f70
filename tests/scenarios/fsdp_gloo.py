"""FSDP2 with torchtitan's gradient-division setting over gloo, two ranks; prints "grad ok".

argv[1]: "patched" applies the CPU adapter first, "upstream" does not. Run under torchrun.
"""

import sys

import torch
import torch.distributed as dist

if sys.argv[1] == "patched":
    from neuron_qwen3 import cpu_adapter

    cpu_adapter.activate()
import torchtitan.distributed.fsdp as tt_fsdp
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
fully_shard(model)
tt_fsdp.disable_fsdp_gradient_division(model)
model(torch.randn(4, 8)).sum().backward()
print(f"grad ok rank={dist.get_rank()}")
dist.destroy_process_group()
