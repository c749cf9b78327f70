"""INIT_FROM's load (load.py) against torchtitan's own, over three FSDP ranks (gloo); run under torchrun.

argv: a scratch folder. For each variant's smoke model: rank 0 saves a random one as a Hugging Face folder
(huggingface_hub's sharded writer, bf16, files of 200 kB and their index); the model, sharded per layer and at the
root (three ranks: most tensors split unevenly, the MoE's 4 experts too), is then loaded from it twice from fresh
random weights, by torchtitan 0.3.0's initial HF load (DCPCheckpointer.dcp_load(from_hf=True)) and by
load.load. Each rank prints
per variant `rank R <variant> saved N of M (F files)`: N of its M weights, gathered whole, equal the saved ones bit
for bit; and `rank R <variant> torchtitan same N of M`: N local shards equal torchtitan's load's, or the error
with which torchtitan refused the sharding.
Then one line for a weight split by columns (TP's Shard(1)): `rank R columns refused` when hf_load declines it.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from huggingface_hub import save_torch_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torchtitan.components.checkpoint import ModelWrapper
from torchtitan.config.override import apply_overrides

from neuron_qwen3 import config_registry
from neuron_qwen3.hf import load, weights
from neuron_qwen3.quirks import hf_rope_fix
from neuron_qwen3.run import teardown

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fsdp",))
hf_rope_fix.apply()  # as the v5 trainer does before it builds its model


def say(line):
    os.write(1, f"{line}\n".encode())  # one write: the ranks' lines share a pipe


def build(name):
    config = getattr(config_registry, name)()
    weights.hf_compatible(config)
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    apply_overrides(config.override, config)  # nki_moe: the NKI experts, as the trainer swaps them in
    with torch.device("meta"):
        model = model_config.build()
    layers = next(m for n, m in model.named_modules() if n.endswith("layers") and len(m))
    for layer in layers.values() if isinstance(layers, torch.nn.ModuleDict) else layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    return model, config.model_spec.state_dict_adapter(model_config, None)


def randomise(model, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights(buffer_device=None)


def shards(model) -> dict:
    return {
        name: (p.to_local() if isinstance(p, DTensor) else p).detach().clone() for name, p in model.named_parameters()
    }


def torchtitan_load(model, adapter, folder):
    """DCPCheckpointer.dcp_load(from_hf=True), as the checkpointer runs it for --checkpoint.initial_load_in_hf."""
    wrapper = ModelWrapper([model])
    hf_state_dict = adapter.to_hf(wrapper.state_dict())
    dcp.load(hf_state_dict, storage_reader=adapter.get_hf_storage_reader(folder))
    wrapper.load_state_dict(adapter.from_hf(hf_state_dict))


def full(model) -> dict:
    return {
        name: p.full_tensor() if isinstance(p, DTensor) else p.detach().clone() for name, p in model.named_parameters()
    }


for variant in ("native", "nki_moe", "v5"):
    model, adapter = build(f"{variant}_qwen3_smoke")
    folder = os.path.join(sys.argv[1], variant)
    randomise(model, 0)
    saved = {name: value.to(torch.bfloat16).float() for name, value in full(model).items()}  # as the files hold it
    state = {
        key: value.full_tensor() if isinstance(value, DTensor) else value
        for key, value in ModelWrapper([model]).state_dict().items()
    }
    if rank == 0:
        os.makedirs(folder)
        tensors = {key: value.to(torch.bfloat16).clone() for key, value in adapter.to_hf(state).items()}
        save_torch_state_dict(tensors, folder, max_shard_size="200KB")
    dist.barrier()
    randomise(model, 1)
    try:
        torchtitan_load(model, adapter, folder)
        theirs = shards(model)
    except ValueError as refused:
        theirs = None
        say(f"rank {rank} {variant} torchtitan: {type(refused).__name__}: {refused}")
    randomise(model, 2)
    assert load.load([model], adapter, folder)
    ours, loaded = shards(model), full(model)
    files = len([name for name in os.listdir(folder) if name.endswith(".safetensors")])
    wrong = sorted(name for name in saved if not torch.equal(saved[name], loaded[name]))
    say(f"rank {rank} {variant} saved {len(saved) - len(wrong)} of {len(saved)} ({files} files)")
    if theirs is not None:
        differ = sorted(name for name in theirs if not torch.equal(theirs[name], ours[name]))
        say(f"rank {rank} {variant} torchtitan same {len(ours) - len(differ)} of {len(ours)}")

linear = torch.nn.Linear(6, 4)
linear.weight = torch.nn.Parameter(distribute_tensor(linear.weight.detach(), mesh, [Shard(1)]))
say(f"rank {rank} columns {'loaded' if load.load([linear], adapter, sys.argv[1]) else 'refused'}")
teardown.destroy_process_groups()  # and the FSDP states' reference cycles, which hold the group (teardown.py)
