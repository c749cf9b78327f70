"""The Hub's sharded safetensors layout of an export, planned from the model's shapes alone.

torchtitan's own HF save gathers the whole model in fp32 on rank 0, copies it to the export dtype and serializes it:
~183 GB in one process for Qwen3-30B-A3B, at 0.11 GB/s. Here the model's state dict is read one layer at a time
(`state_dict_pieces`), and `plan` lays out the files (the Hub's split, headers first) from the shapes, the same on
every rank, so that every rank can then write its own rows in place (write.py). `in_place` says which tensors
can be: rows whole per rank (FSDP, HSDP); the INIT_FROM load (load.py) reads by the same rule.
"""

import dataclasses
import functools
import itertools
import json
import math
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor, Shard

SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
SAFE_DTYPES = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


class ExportError(RuntimeError):
    """Some rank could not write its part of the export; the half-written folder has been removed."""


class CoverageError(RuntimeError):
    """The adapter cannot map some of the model's weights to Hugging Face keys."""


@dataclass(frozen=True)
class Entry:
    """One Hugging Face tensor of the export and where its bytes go (`offset`: in its file)."""

    name: str
    shape: tuple
    dtype: torch.dtype
    offset: int = 0

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class Unit:
    """One checkpoint tensor and the Hugging Face tensors the adapter makes of it (an MoE layer's stacked experts:
    one per expert), in file order. `slices`: each of those is a contiguous slice of the checkpoint tensor and
    together, in that order, they tile it, so the unit's bytes in the file are the tensor's own, row by row."""

    key: str
    entries: tuple
    slices: bool
    file: int = 0

    @property
    def nbytes(self) -> int:
        return sum(entry.nbytes for entry in self.entries)


@dataclass(frozen=True)
class Layout:
    units: list
    files: list  # the Hub's names: model.safetensors, or model-00001-of-00003.safetensors ...
    headers: list  # each file's safetensors header, length prefix and padding included


# ---- reading the model a layer at a time ---------------------------------------------------------------------


def _kept(piece, keep) -> dict:
    return {key: value for key, value in piece().items() if keep(key)}


def state_dict_pieces(model_parts, keep=None) -> list:
    """The model's state dict (the checkpointer's keys; with `keep`, the keys it accepts) in pieces, as functions
    to call in turn: one per transformer layer and per other child of a model part, in Module.state_dict's order.
    torchtitan's fused-QKV state-dict hook hands out each layer's q/k/v whole on every rank, so the whole state
    dict at once holds every layer's attention weights unsharded (14 GB per rank at 235B-A22B); a piece holds one
    layer's. A part with tensors or state-dict hooks of its own is one piece."""
    pieces = []
    for part in model_parts:
        own = next(itertools.chain(part.parameters(recurse=False), part.buffers(recurse=False)), None)
        if own is not None or part._state_dict_hooks or part._state_dict_pre_hooks:
            pieces.append(part.state_dict)
            continue
        for name, child in part._modules.items():  # what state_dict walks (v5's model overrides named_children)
            for index, module in child._modules.items() if name == "layers" else [(None, child)]:
                prefix = f"{name}." if index is None else f"{name}.{index}."
                pieces.append(functools.partial(module.state_dict, prefix=prefix))
    return pieces if keep is None else [functools.partial(_kept, piece, keep) for piece in pieces]


def meta_shapes(pieces) -> dict:
    """key -> a meta tensor of its shape and dtype, piece by piece (each piece is dropped before the next)."""
    shapes = {}
    for piece in pieces:
        shapes.update((key, torch.empty(v.shape, dtype=v.dtype, device="meta")) for key, v in piece().items())
    return shapes


# ---- the layout ------------------------------------------------------------------------------------------------


def unit_of(adapter, key: str, value, wanted: dict, dtype) -> Unit | None:
    """The unit of `value` (a meta tensor): which HF tensors to_hf makes of it, and whether they are its slices
    (told by the views to_hf returns: a rename is the tensor itself, the expert split is torch.split views)."""
    out = {name: tensor for name, tensor in adapter.to_hf({key: value}).items() if name in wanted}
    if not out:
        return None
    views = all((t is value or t._base is value) and t.is_contiguous() for t in out.values())
    order = sorted(out, key=lambda name: out[name].storage_offset()) if views else list(out)
    ends = [out[name].storage_offset() + out[name].numel() for name in order]
    starts = [out[name].storage_offset() for name in order]
    slices = views and starts == [0, *ends[:-1]] and ends[-1] == value.numel()
    entries = tuple(
        Entry(name, tuple(out[name].shape), dtype if out[name].is_floating_point() else out[name].dtype)
        for name in order
    )
    return Unit(key, entries, slices)


def header(entries: list) -> bytes:
    """A safetensors header: 8-byte little-endian length, the JSON (offsets from the end of the header), padded
    with spaces to a multiple of 8 as safetensors pads it."""
    table, start = {"__metadata__": {"format": "pt"}}, 0
    for entry in entries:
        table[entry.name] = {
            "dtype": SAFE_DTYPES[entry.dtype],
            "shape": list(entry.shape),
            "data_offsets": [start, start + entry.nbytes],
        }
        start += entry.nbytes
    raw = json.dumps(table, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def plan(adapter, shapes: dict, dtype, max_shard_bytes: int) -> Layout:
    """The export's files and where every tensor goes, from the checkpoint tensors' shapes (`shapes`: key ->
    tensor, of any device), the same on every rank: the Hub's split in state-dict order (a file closes before the
    unit that would take it over `max_shard_bytes`; a unit larger than that is a file of its own), of whole
    checkpoint tensors."""
    meta = {key: torch.empty(value.shape, dtype=value.dtype, device="meta") for key, value in shapes.items()}
    wanted = adapter.to_hf(dict(meta))  # the whole model at once: what the export holds (no tied lm_head)
    units = [u for u in (unit_of(adapter, key, value, wanted, dtype) for key, value in meta.items()) if u]
    missing = set(wanted) - {entry.name for unit in units for entry in unit.entries}
    if missing:
        raise CoverageError(
            f"{type(adapter).__name__} does not convert tensor by tensor: {sorted(missing)[:3]} "
            "appear only from the whole state dict"
        )
    groups, size = [], 0
    for unit in units:
        if not groups or size + unit.nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(unit)
        size += unit.nbytes
    placed, headers = [], []
    for file, group in enumerate(groups):
        headers.append(header([entry for unit in group for entry in unit.entries]))
        offset = len(headers[-1])
        for unit in group:
            entries = []
            for entry in unit.entries:
                entries.append(dataclasses.replace(entry, offset=offset))
                offset += entry.nbytes
            placed.append(dataclasses.replace(unit, entries=tuple(entries), file=file))
    files = (
        [SAFE_WEIGHTS]
        if len(groups) == 1
        else [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    )
    return Layout(placed, files, headers)


def index_json(layout: Layout) -> str:
    """model.safetensors.index.json as transformers' save_pretrained writes it."""
    entries = [(entry, layout.files[unit.file]) for unit in layout.units for entry in unit.entries]
    index = {
        "metadata": {
            "total_parameters": sum(math.prod(e.shape) for e, _ in entries),
            "total_size": sum(e.nbytes for e, _ in entries),
        },
        "weight_map": {entry.name: file for entry, file in entries},
    }
    return json.dumps(index, indent=2, sort_keys=True) + "\n"


# ---- each rank's part ------------------------------------------------------------------------------------------


def in_place(value) -> bool:
    """Whether each rank's part of `value` is whole rows of it: a plain tensor, or a DTensor sharded on dim 0
    (FSDP) and/or replicated (HSDP). Other placements (TP, EP's strided shards) are gathered instead."""
    if not isinstance(value, DTensor):
        return True
    return all(p.is_replicate() or (type(p) is Shard and p.dim == 0) for p in value.placements)
