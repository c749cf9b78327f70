"""Which checkpoint a restart resumes from, decided in the launcher's pre-launch pass (preflight.py).

torchtitan resumes from the highest `step-N` folder of the checkpoint folder that holds a `.metadata` file.
DCP writes `.metadata` last, after every rank's data files, so a save cut short by SIGTERM or SIGKILL leaves a
folder without it, which torchtitan skips. Such a folder may also be a save still being written by another
process (a job that is still stopping), so it is left where it is: only reported. torchtitan does not skip a
folder whose `.metadata` is there but whose data is not (a truncated copy, a full disk, a lost shard): it loads it
and crashes, on every restart. So each `step-N` folder is checked the way DCP will read it: its `.metadata` reads
(torch's own FileSystemReader), and every byte range it points to exists in its data file. Only those provably
broken folders are moved to `<folder>/incomplete/`, where torchtitan does not look, so its own "newest step-N" is
the newest complete one, including after torchrun restarts workers in place. `incomplete/` keeps only what the
latest launch moved there (older entries are deleted: full-scale checkpoints are hundreds of GB). A read error
other than "not found" (EACCES, EIO, ESTALE) proves nothing about the checkpoint: it stops the launch with one line
and moves nothing. `.metadata` is a pickle, read here as the workers will read it when they resume: a checkpoint
folder is trusted input.
"""

import errno
import os
import re
import shutil
import time
from dataclasses import dataclass

from neuron_qwen3.hf import fetch

STEP = re.compile(r"step-(\d+)")  # torchtitan's own pattern, searched in each entry of the folder
ASIDE = "incomplete"  # holds no "step-N" in its name, so torchtitan neither loads nor purges it


def _storage_ranges(folder) -> dict:
    """{data file: bytes it must hold at least} from a DCP checkpoint's `.metadata`; ValueError if unreadable."""
    from torch.distributed.checkpoint import FileSystemReader

    _read(os.path.join(folder, ".metadata"))  # a read error is not damage: raised as OSError, one line
    try:
        metadata = FileSystemReader(str(folder)).read_metadata()
    except FileNotFoundError:
        raise
    except Exception as error:  # any unpickling failure means a damaged file
        raise ValueError(f"unreadable .metadata ({type(error).__name__})") from None
    needed = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    return needed


def _io_error(path, error) -> OSError:
    """One line for a read error that says nothing about the checkpoint itself: the launch stops there."""
    name = errno.errorcode.get(error.errno, "?")
    return OSError(
        f"cannot read {path}: {error.strerror} ({name}); nothing was moved: fix its access (the "
        f"container runs as uid {os.getuid()}) or move the checkpoint away, then restart"
    )


def _read(path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise
    except OSError as error:
        raise _io_error(path, error) from None


def _size(path) -> int | None:
    """Bytes in `path`, None if it does not exist; any other error stops the launch."""
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise _io_error(path, error) from None


def unfinished(folder) -> bool:
    """No `.metadata` and no HF index: a save cut short or still being written; torchtitan skips it."""
    return not any(os.path.isfile(os.path.join(folder, name)) for name in (".metadata", "model.safetensors.index.json"))


def problem(folder) -> str | None:
    """None if the checkpoint in `folder` is complete, else why not, in a few words."""
    index = os.path.join(folder, "model.safetensors.index.json")  # torchtitan's other format (HF, last step)
    if not os.path.isfile(os.path.join(folder, ".metadata")) and os.path.isfile(index):
        missing = fetch.missing_shards(folder)
        if missing is None:
            return "unreadable model.safetensors.index.json"
        return f"{missing[0]} is missing" if missing else None
    if not os.path.isfile(os.path.join(folder, ".metadata")):
        return "no .metadata: the save did not finish"
    try:
        needed = _storage_ranges(folder)
    except FileNotFoundError:  # gone since isfile: someone else is moving or purging it
        return "no .metadata: the save did not finish"
    except ValueError as error:
        return str(error)
    for name, size in sorted(needed.items()):
        actual = _size(os.path.join(folder, name))
        if actual is None:
            return f"{name} is missing"
        if actual < size:
            return f"{name} has {actual} bytes, .metadata needs {size}"
    return None


@dataclass(frozen=True)
class Scan:
    folder: str
    latest: int | None  # newest complete step, None if there is none
    broken: tuple  # (entry name, step, why) of each step-N folder that is provably broken
    unfinished: tuple = ()  # entry names of the step-N folders without .metadata: never moved


def scan(folder) -> Scan:
    """Every `step-N` folder torchtitan would consider, checked; a missing folder is an empty scan."""
    try:
        entries = sorted(os.listdir(folder))
    except FileNotFoundError:
        return Scan(str(folder), None, ())
    complete, broken, cut = [], [], []
    for name in entries:
        match = STEP.search(name)
        path = os.path.join(folder, name)
        if not match or not os.path.isdir(path):
            continue  # torchtitan ignores these too
        if unfinished(path):
            cut.append(name)
            continue
        why = problem(path)
        if why:
            broken.append((name, int(match[1]), why))
        else:
            complete.append(int(match[1]))
    return Scan(str(folder), max(complete, default=None), tuple(broken), tuple(cut))


def set_aside(found: Scan) -> tuple:
    """Move every broken step-N folder into <folder>/incomplete/, and delete what earlier launches left there.

    Returns (the new paths, the deleted paths)."""
    if not found.broken:
        return [], []
    aside = os.path.join(found.folder, ASIDE)
    os.makedirs(aside, exist_ok=True)
    older = [os.path.join(aside, name) for name in sorted(os.listdir(aside))]
    moved = []
    for name, _, _ in found.broken:
        target = os.path.join(aside, f"{name}.{time.strftime('%Y%m%dT%H%M%S')}.{os.getpid()}")
        os.rename(os.path.join(found.folder, name), target)
        moved.append(target)
    for path in older:
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    return moved, older


def prepare(folder, node_rank: int, move: bool = True) -> tuple:
    """Scan `folder` and, on node 0 only (the folder is shared) and when `move`, move the broken checkpoints aside.

    Returns (the newest complete step or None, warning lines). Other nodes report the same scan and leave the
    folder alone: node 0 finishes moving before torchrun's rendezvous lets any worker start.
    """
    found = scan(folder)
    moving = move and node_rank == 0
    lines = [
        f"checkpoint {os.path.join(folder, name)} is broken ({why}): "
        + ("moved to " + os.path.join(folder, ASIDE) if moving else "skipped")
        for name, _, why in found.broken
    ]
    lines += [
        f"checkpoint {os.path.join(folder, name)} has no .metadata (a save cut short, or one still being "
        "written): torchtitan skips it; left in place"
        for name in found.unfinished
    ]
    if moving:
        lines += [f"deleted {path}: set aside by an earlier launch" for path in set_aside(found)[1]]
    return found.latest, lines
