"""The export over two FSDP ranks (gloo) of the native smoke model, in files of 1 MB; run under torchrun.

argv: "ok" or "fail" (rank 1's writes raise), then the export folder. Each rank prints one line: the bytes it
wrote, or the error it raised; with "ok", rank 0 then prints whether the files hold the model's weights.
"""

import os
import sys
import types

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.fsdp import fully_shard

from neuron_qwen3 import config_registry
from neuron_qwen3.hf import weights, write
from neuron_qwen3.run import teardown

dist.init_process_group("gloo")
rank = dist.get_rank()
config = config_registry.native_qwen3_smoke()
config.export.dir, config.export.max_shard_mb = sys.argv[2], 1
config.checkpoint.initial_load_in_hf = True
with torch.device("meta"):
    model = config.model_spec.model.build()
for layer in model.layers.values():
    fully_shard(layer)
fully_shard(model)
model.to_empty(device="cpu")
with torch.no_grad():
    model.init_weights(buffer_device=None)
trainer = types.SimpleNamespace(config=config, model_parts=[model], model_config=config.model_spec.model)

written, real = [], write.pwrite_all


def pwrite_all(fd, tensor, offset):
    if sys.argv[1] == "fail" and rank == 1:
        raise OSError(f"disk full on rank {rank}")
    written.append(tensor.numel() * tensor.element_size())
    real(fd, tensor, offset)


write.pwrite_all = pwrite_all


def say(line):
    os.write(1, f"{line}\n".encode())  # one write: the two ranks' lines share a pipe and must not interleave


try:
    weights.export(trainer)
    say(f"rank {rank} wrote {sum(written)} bytes in {len(written)} writes")
except weights.ExportError as error:
    say(f"rank {rank} raised {error}")
full = {key: value.full_tensor().to(torch.bfloat16) for key, value in model.state_dict().items()}  # every rank
if rank == 0 and sys.argv[1] == "ok":
    want = weights._adapter(trainer).to_hf(full)
    found = {}
    for name in os.listdir(sys.argv[2]):
        if name.endswith(".safetensors"):
            found.update(load_file(os.path.join(sys.argv[2], name)))
    same = sorted(found) == sorted(want) and all(torch.equal(found[k], want[k]) for k in want)
    say("same weights" if same else "different weights")
teardown.destroy_process_groups()  # and the FSDP states' reference cycles, which hold the group (teardown.py)
