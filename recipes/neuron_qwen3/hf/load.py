"""INIT_FROM's load: every rank copies its own rows of the Hugging Face safetensors straight into its shards.

torchtitan 0.3.0's initial HF load (DCPCheckpointer.dcp_load(from_hf=True)) goes through the model's state dict,
whose fused-QKV hooks (FusedQKVLinear._split_qkv_on_save and _merge_qkv_on_load, models/common/attention.py)
gather every layer's attention weights whole on every rank and copy them twice: 0.13-0.31x a plain read of the
files (bench/RESULTS.md), 3.5 B parameters replicated per rank at Qwen3-235B-A22B. Here each parameter's local
rows are read from the memory-mapped files and copied in once. The layouts are torchtitan's own: the adapter's
to_hf names each tensor (renames, the experts' split; shards.unit_of) and the fused QKV's own merge hook, run on
row numbers, says which q, k or v row each fused row is. `load` returns False, having read nothing, when some
weight is sharded other than by rows (TP, EP): torchtitan's path loads that model. Experts that do not divide
evenly over the ranks load here too; torchtitan 0.3.0's MoE adapter refuses them.
"""

import json
import os
from dataclasses import dataclass

import torch
from safetensors import safe_open
from torch.distributed.checkpoint.state_dict import _get_fqns
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torchtitan.models.common.attention import FusedQKVLinear

from neuron_qwen3.hf import shards


class LoadError(RuntimeError):
    """The folder lacks a tensor the model needs, or holds it in another shape."""


@dataclass(frozen=True)
class Run:
    """Parameter rows [at, at + count) are rows [start, start + count) of the Hugging Face tensor `name`, whose
    shape must be `shape`; or, `whole`, the tensor is parameter row `at` (an expert of the stacked experts)."""

    name: str
    shape: tuple
    at: int
    start: int = 0
    count: int = 1
    whole: bool = False


def tensor_files(folder: str) -> dict:
    """Hugging Face tensor name -> its safetensors file: the index's weight map, else every *.safetensors."""
    index = os.path.join(folder, shards.SAFE_INDEX)
    if os.path.isfile(index):
        with open(index) as f:
            return {name: os.path.join(folder, file) for name, file in json.load(f)["weight_map"].items()}
    files = {}
    for file in sorted(name for name in os.listdir(folder) if name.endswith(".safetensors")):
        with safe_open(os.path.join(folder, file), framework="pt") as handle:
            files.update(dict.fromkeys(handle.keys(), os.path.join(folder, file)))
    return files


def fused_runs(module: FusedQKVLinear, prefix: str, param: str, shapes: dict, names: dict) -> list:
    """The fused `wqkv.<param>` as Runs of the q, k and v tensors, from torchtitan's own merge hook run on the row
    numbers of the three (`shapes`: their state-dict key -> torch.Size; `names`: -> Hugging Face name)."""
    keys = [f"{prefix}{w}.{param}" for w in ("wq", "wk", "wv")]
    starts = [0, shapes[keys[0]][0], shapes[keys[0]][0] + shapes[keys[1]][0]]
    numbers = {key: torch.arange(start, start + shapes[key][0]).reshape(-1, 1) for key, start in zip(keys, starts)}
    module._merge_qkv_on_load(module, numbers, prefix)
    order = numbers[f"{prefix}wqkv.{param}"].reshape(-1)
    owner = torch.bucketize(order, torch.tensor(starts[1:]), right=True)  # 0: q, 1: k, 2: v
    breaks = torch.ones(len(order), dtype=torch.bool)
    breaks[1:] = (order[1:] != order[:-1] + 1) | (owner[1:] != owner[:-1])
    firsts = breaks.nonzero().reshape(-1).tolist()
    return [
        Run(names[keys[owner[at]]], tuple(shapes[keys[owner[at]]]), at, int(order[at]) - starts[owner[at]], end - at)
        for at, end in zip(firsts, firsts[1:] + [len(order)])
    ]


def sources(adapter, key: str, value) -> tuple:
    """(the Hugging Face names to_hf gives `key`, whether they tile it in order, one per row or all of it)."""
    meta = torch.empty(value.shape, dtype=value.dtype, device="meta")
    unit = shards.unit_of(adapter, key, meta, adapter.to_hf({key: meta}), value.dtype)
    if unit is None:
        return (), False
    one_per_row = len(unit.entries) == value.shape[0] and all(e.shape == tuple(value.shape[1:]) for e in unit.entries)
    whole = len(unit.entries) == 1 and unit.entries[0].shape == tuple(value.shape)
    return tuple(e.name for e in unit.entries), unit.slices and (one_per_row or whole)


def state_tensors(part):
    """(name, tensor) of what `part.state_dict` holds before its hooks: parameters and persistent buffers."""
    yield from part.named_parameters()
    for name, buffer in part.named_buffers():
        owner, _, leaf = name.rpartition(".")
        if leaf not in part.get_submodule(owner)._non_persistent_buffers_set:
            yield name, buffer


def plans(part, adapter, keep) -> list | None:
    """(local tensor, first global row, [Run]) for each weight of `part` with a Hugging Face source; None if one is
    not held as whole rows."""
    found = []
    for raw, value in state_tensors(part):
        (key,) = _get_fqns(part, raw)
        if not keep(key):
            continue
        if not shards.in_place(value):
            return None
        if isinstance(value, DTensor):
            local = value.to_local()
            first = compute_local_shape_and_global_offset(value.shape, value.device_mesh, value.placements)[1][0]
        else:
            local, first = value, 0
        module_name, _, param = raw.rpartition(".")
        owner_name, _, leaf = module_name.rpartition(".")
        owner = part.get_submodule(owner_name) if leaf == "wqkv" else None
        if isinstance(owner, FusedQKVLinear):
            prefix = key[: -len(f"wqkv.{param}")]
            hd, heads = owner.head_dim, value.shape[0] // owner.head_dim // owner.r_dim
            split = {
                f"{prefix}wq.{param}": (heads * owner.heads_per_kv * hd, *value.shape[1:]),
                f"{prefix}wk.{param}": (heads * hd, *value.shape[1:]),
                f"{prefix}wv.{param}": (heads * hd, *value.shape[1:]),
            }
            names = {k: next(iter(adapter.to_hf({k: torch.empty(s, device="meta")}))) for k, s in split.items()}
            found.append((local, first, fused_runs(owner, prefix, param, split, names)))
            continue
        names, tiled = sources(adapter, key, value)
        if not names:
            continue
        if not tiled:
            return None
        if len(names) == 1:
            found.append((local, first, [Run(names[0], tuple(value.shape), 0, 0, value.shape[0])]))
        else:  # one Hugging Face tensor per row (the experts)
            runs = [Run(name, tuple(value.shape[1:]), row, whole=True) for row, name in enumerate(names)]
            found.append((local, first, runs))
    return found


class Files:
    """The folder's safetensors, each opened once (memory-mapped) on first use."""

    def __init__(self, folder: str):
        self.where, self.open = tensor_files(folder), {}

    def rows(self, run: Run, low: int, high: int):
        """Parameter rows [low, high) of `run` (within it), read from the file."""
        if run.name not in self.where:
            raise LoadError(f"{run.name} is not in the folder's safetensors: the model needs it")
        path = self.where[run.name]
        if path not in self.open:
            self.open[path] = safe_open(path, framework="pt")
        piece = self.open[path].get_slice(run.name)
        if tuple(piece.get_shape()) != run.shape:
            raise LoadError(f"{run.name} is {list(piece.get_shape())} in the folder, the model's is {list(run.shape)}")
        if run.whole:
            return piece[:].unsqueeze(0)
        first = run.start + low - run.at
        return piece[first : first + high - low]


def copy_rows(files: Files, local, first: int, runs_of: list) -> None:
    """This rank's rows [first, first + len(local)) of one parameter, from the runs that overlap them."""
    for run in runs_of:
        low, high = max(run.at, first), min(run.at + run.count, first + local.shape[0])
        if low < high:
            local[low - first : high - first].copy_(files.rows(run, low, high))


@torch.no_grad()
def load(model_parts, adapter, folder: str, keep=lambda key: True) -> bool:
    """Copy the Hugging Face folder's weights into the model's (the keys `keep` accepts), each rank its own rows;
    False, with nothing read, when some weight is not held as whole rows. Every rank must call it."""
    found = []
    for part in model_parts:
        planned = plans(part, adapter, keep)
        if planned is None:
            return False
        found += planned
    files = Files(folder)
    for local, first, runs_of in found:
        copy_rows(files, local, first, runs_of)
    return True
