"""The streamed export: every rank writes its own rows of the planned files (shards.py), in a staged folder.

Rank 0 makes the files at their full size; then every rank writes its own FSDP rows of each tensor, cast to the
export dtype, at their offsets (`write_model`): nothing is gathered and no rank holds more than its shard and two
tensors in flight. Tensors whose rank parts are not whole rows (TP, EP) and runs over several hosts gather each
tensor to one writer on rank 0's host instead.

`staged` is the atomic folder every export goes through (the model folder; LoRA's adapter folder too): made beside
the target, renamed into place once every rank's part is written, removed after a failure anywhere (the earlier
export stays), and every rank raises the same ExportError. Every step that needs all ranks ends in an exchange of
errors, so a rank that fails still takes the same branch as the others (no rank is left in a collective).
"""

import contextlib
import os
import shutil
import socket
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from neuron_qwen3.hf.shards import SAFE_INDEX, ExportError, Layout, Unit, in_place, index_json, meta_shapes, plan

IN_FLIGHT = 2  # tensors a rank's writer thread may hold: the one it writes and the next


def local_rows(value, dtype, owner: bool):
    """This rank's rows of an `in_place` tensor to write, as (tensor on the CPU in `dtype`, first row), or None:
    a DTensor's local shard where the rank is the first of its replicas; a replicated or plain one, by its owner."""

    def cast(tensor):
        tensor = tensor.detach()
        return (tensor.to(dtype) if tensor.is_floating_point() else tensor).contiguous().to("cpu")

    if not isinstance(value, DTensor) or all(p.is_replicate() for p in value.placements):
        return (cast(value.to_local() if isinstance(value, DTensor) else value), 0) if owner else None
    coordinate = value.device_mesh.get_coordinate()
    if any(p.is_replicate() and c != 0 for p, c in zip(value.placements, coordinate)):
        return None
    local = value.to_local()
    shape, offset = compute_local_shape_and_global_offset(value.shape, value.device_mesh, value.placements)
    assert tuple(local.shape) == tuple(shape), (value.shape, value.placements, local.shape, shape)
    return (cast(local), offset[0]) if local.numel() else None


def gathered(value, dtype):
    """`value` whole on its own device, in the export dtype: the local shard is cast first, so the gather moves
    export-dtype bytes (casting before or after the gather rounds alike). Every rank must call it, in order."""
    value = value.detach()
    if value.is_floating_point():
        value = value.to(dtype)
    return value.full_tensor() if isinstance(value, DTensor) else value


def pwrite_all(fd: int, tensor, offset: int) -> None:
    data = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
    while data:  # one pwrite moves at most ~2 GiB
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def failure_line(rank: int, failure: BaseException) -> str:
    return f"rank {rank}: {type(failure).__name__}: {failure}"


class Writer:
    """A rank's writes, in a thread (pwrite lets go of the GIL), at most IN_FLIGHT tensors held; the first error
    is kept as one line and later writes are dropped."""

    def __init__(self, folder: str, files: list, rank: int):
        self.paths, self.fds, self.rank = [os.path.join(folder, f) for f in files], {}, rank
        self.pool, self.pending, self.error = ThreadPoolExecutor(max_workers=1), [], None

    def put(self, file: int, offset: int, tensor) -> None:
        while len(self.pending) >= IN_FLIGHT:
            self._wait(self.pending.pop(0))
        if self.error is None:
            if file not in self.fds:
                self.fds[file] = os.open(self.paths[file], os.O_WRONLY)
            self.pending.append(self.pool.submit(pwrite_all, self.fds[file], tensor, offset))

    def _wait(self, future) -> None:
        try:
            future.result()
        except Exception as failure:  # reported to every rank, raised by all
            self.error = self.error or failure_line(self.rank, failure)

    def close(self) -> str | None:
        for future in self.pending:
            self._wait(future)
        self.pool.shutdown()
        for fd in self.fds.values():
            os.close(fd)
        return self.error


class Ranks:
    """Who takes part: this rank, rank 0's pid (it names the staging folder), the ranks that write (those on rank
    0's host: another node's disk may not be the one rank 0 renames on) and whether that is every rank. Object
    collectives go over a gloo group of their own: the device's backend need not carry them. Every rank must
    make one, and close it."""

    def __init__(self):
        self.distributed = dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.group = dist.new_group(backend="gloo") if self.distributed else None
        hosts = self.gather((socket.gethostname(), os.getpid()))
        host, self.pid = hosts[0]
        self.writers = [rank for rank, (name, _) in enumerate(hosts) if name == host]
        self.one_host = len(self.writers) == len(hosts)

    def gather(self, value) -> list:
        if not self.distributed:
            return [value]
        values = [None] * dist.get_world_size()
        dist.all_gather_object(values, value, group=self.group)
        return values

    def agree(self, error: str | None) -> None:
        """Raise ExportError on every rank if any rank has an error (the first rank's, as one line)."""
        first = next((e for e in self.gather(error) if e), None)
        if first:
            raise ExportError(first)

    def on_rank_0(self, step, *args) -> None:
        """`step(*args)` on rank 0, then agree on its outcome."""
        error = None
        if self.rank == 0:
            try:
                step(*args)
            except Exception as failure:
                error = failure_line(0, failure)
        self.agree(error)

    def close(self) -> None:
        if self.group is not None:
            dist.destroy_process_group(self.group)


# ---- the model's files -----------------------------------------------------------------------------------------


def write_unit(writer: Writer, adapter, unit: Unit, value, dtype, ranks: Ranks, owner: int) -> None:
    if unit.slices and ranks.one_host and in_place(value):
        rows = local_rows(value, dtype, owner == ranks.rank)
        if rows is not None:
            tensor, first = rows
            row_bytes = tensor[0].numel() * tensor.element_size() if tensor.dim() else 0
            writer.put(unit.file, unit.entries[0].offset + first * row_bytes, tensor)
        return
    full = gathered(value, dtype)
    if owner == ranks.rank:
        converted = adapter.to_hf({unit.key: full.to("cpu")})
        for entry in unit.entries:
            writer.put(unit.file, entry.offset, converted[entry.name].contiguous())


def write_units(ranks: Ranks, folder: str, adapter, pieces: list, layout: Layout, dtype) -> str | None:
    """Every rank writes its part of each unit in place, in the files rank 0 made: with all ranks on one host and
    an `in_place` tensor, its own rows (no gather); otherwise the unit is gathered and its owner (units dealt over
    the writers in turn) converts and writes it. Returns this rank's first error as a line, or None; after an
    error it still takes part in every gather."""
    writer = Writer(folder, layout.files, ranks.rank)
    units = {unit.key: (i, unit) for i, unit in enumerate(layout.units)}
    try:
        for piece in pieces:
            for key, value in piece().items():
                if key in units:  # not a tied lm_head
                    i, unit = units[key]
                    write_unit(writer, adapter, unit, value, dtype, ranks, ranks.writers[i % len(ranks.writers)])
    finally:
        error = writer.close()
    return error


def create_files(folder: str, layout: Layout) -> None:
    """Every file at its full size, its header written (the rest is filled in by the ranks)."""
    for i, (name, head) in enumerate(zip(layout.files, layout.headers)):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(head)
            f.truncate(len(head) + sum(u.nbytes for u in layout.units if u.file == i))


def write_index(folder: str, layout: Layout) -> None:
    if len(layout.files) > 1:
        with open(os.path.join(folder, SAFE_INDEX), "w") as f:
            f.write(index_json(layout))


@torch.no_grad()
def write_model(ranks: Ranks, folder: str, adapter, pieces: list, dtype, max_shard_bytes: int) -> Layout:
    """Every rank: the Hugging Face safetensors of `pieces` (state_dict_pieces; `adapter`: the model's state-dict
    adapter) in `folder`, files of at most `max_shard_bytes` and their index, as transformers writes them. Raises
    ExportError on every rank if any rank failed."""
    layout = plan(adapter, meta_shapes(pieces), dtype, max_shard_bytes)
    ranks.on_rank_0(create_files, folder, layout)
    ranks.agree(write_units(ranks, folder, adapter, pieces, layout, dtype))
    ranks.on_rank_0(write_index, folder, layout)
    return layout


# ---- the staged folder -----------------------------------------------------------------------------------------


def publish(staging: str, target: str) -> None:
    """Rename the finished folder into place; a rerun replaces its earlier export only once this one is whole."""
    if os.path.exists(target):
        old = staging.replace(".partial-", ".old-")
        os.rename(target, old)
        os.rename(staging, target)
        shutil.rmtree(old)
    else:
        os.rename(staging, target)


def _fresh(staging: str) -> None:
    shutil.rmtree(staging, ignore_errors=True)  # a crashed earlier run's, with this pid
    os.makedirs(staging)


@contextlib.contextmanager
def staged(ranks: Ranks, target: str):
    """Every rank: a folder beside `target` (absolute) for the block to fill, renamed into place by rank 0 once the
    block has ended on every rank without an error. On an error on any rank, in the block or in the rename, the
    folder is removed, `target` is left as it was and every rank raises ExportError. Inside the block, a step that
    needs every rank must end in Ranks.agree (write_model's steps do)."""
    staging = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.partial-{ranks.pid}")
    try:
        ranks.on_rank_0(_fresh, staging)
        error = None
        try:
            yield staging
        except ExportError as failure:  # agreed already
            error = str(failure)
        except Exception as failure:
            error = failure_line(ranks.rank, failure)
        ranks.agree(error)
        ranks.on_rank_0(publish, staging, target)
    except ExportError as failure:
        raise ExportError(f"the export to {target} failed, nothing was written there: {failure}") from None
    finally:
        if ranks.rank == 0 and os.path.exists(staging):
            shutil.rmtree(staging)
