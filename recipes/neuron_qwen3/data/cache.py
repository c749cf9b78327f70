"""The token cache: each record of a local table tokenized and masked once, in parallel, then shared by every
rank of every node and every later run as memory-mapped .npy arrays under `--dataloader.cache_dir`.

Why: a 2,300-token conversation costs ~2 ms of one core to render, tokenize and mask, and EPOCHS' plan in the
pre-launch pass and then every worker did it again for every record on every run. Now the first to open a set
builds its cache, one spawned process per core of the host (the callers have imported torch, whose threads a
fork would not carry); every other opener, on any node that shares the folder, waits on the build's lock and
then reads a record's ids and mask by its index, without reading or parsing the record.

A cache is `<cache_dir>/<key>/`. The key hashes what the tokens depend on: the data files' bytes in order, their
kind (.jsonl, ...), the tokenizer (tokenizer.json, tokenizer_config.json) and the chat template the Encoder
renders with, DATASET_FIELD, TRAIN_ON, FORMAT, and the code and library versions that turn records into tokens.
Text or conversations follows from those and is kept in the marker, so a hit reads no record. Hashing gigabytes
at every open would itself be slow: each file's hash is remembered in `hashes.json` beside the caches by (path,
size, mtime_ns), so only a file whose size or modification time changed is read again (as make and rsync do,
the time is trusted: a rewrite of the same size within one mtime tick goes unseen).

Inside: per chunk K of records, `ids-K.npy` (int32) and `mask-K.npy` (uint8, 1 where the token is a trained
label: labels = ids[1:] where mask[1:], else IGNORE_INDEX), each written by the process that tokenized it;
`index.npy` (per record: its chunk, offset, length, messages, and its turn starts' place in `turns.npy`); and,
last, `done.json` with every file's size. It is built in `<key>.tmp-<host>-<pid>` and renamed into place when
complete, under an flock on `<key>.lock`. An opener checks the marker and every size, so a cache cut short is
rebuilt, never read; the next builder removes a killed builder's tmp folder (its pid gone on this host, or a day
old). Where flock does not lock across nodes, two builders can both finish: the second rename fails and that
builder discards its own copy.

Only local tables are cached: streams (c4, Hub datasets of text) and Hub tables are tokenized as they are read
(a Hub dataset has no local files whose content could key a cache).
"""

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import multiprocessing
import os
import re
import shutil
import socket
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from collections.abc import Iterator

import numpy as np
from torchtitan.components.loss import IGNORE_INDEX

from neuron_qwen3.data import conversations, dataset, records, tokens
from neuron_qwen3.data.conversations import Problem
from neuron_qwen3.data.records import DataError
from neuron_qwen3.data.tokens import Document

FORMAT = 1
DONE = "done.json"  # the marker, written last
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CODE = (records, conversations, tokens, dataset)  # a record's tokens are theirs: an edit or upgrade rebuilds
LIBRARIES = ("tokenizers", "transformers", "jinja2")
SERIAL = 2048  # fewer records are tokenized in this process: a spawned one first spends seconds on its imports
CHUNK = (256, 2048)  # records per chunk, least and most: about 8 chunks a process, so the processes end together
INDEX = np.dtype(
    [
        ("chunk", "<i4"),
        ("offset", "<i8"),
        ("length", "<i4"),
        ("messages", "<i4"),
        ("turns", "<i8"),
        ("turn_count", "<i4"),
    ]
)
TMP = re.compile(r".+\.tmp-(.+)-(\d+)")
STALE_S = 86400  # a tmp folder untouched this long is a dead builder's, whichever host it ran on
HOST = socket.gethostname()


class Tokens:
    """A complete cache, memory-mapped: each record's Document by index, and what a reader asks of a Table (its
    length; where a record is, from the table itself, opened only to say so)."""

    def __init__(self, folder: str, source: str, done: dict):
        self.folder, self.source, self.kind, self.writers = folder, source, done["kind"], done["writers"]
        self.built_s = done.get("seconds")  # the build's, in whichever run built it
        self.index = np.load(os.path.join(folder, "index.npy"), mmap_mode="r")
        self.turns = np.load(os.path.join(folder, "turns.npy"), mmap_mode="r")
        self.hit, self.seconds, self._table = True, 0.0, None

    def __len__(self):
        return len(self.index)

    @property
    def labels(self) -> np.ndarray:
        """Each record's label count (its tokens less one): what it fills of windows unless `fit` cuts it."""
        return self.index["length"].astype(np.int64) - 1

    def document(self, i: int) -> Document:
        return next(self.documents([i]))[1]

    def documents(self, indices) -> Iterator[tuple[int, Document]]:
        """(i, Document) of each of `indices`, in increasing order. Each chunk's two arrays are mapped for its
        records here and let go after, so a rank's resident memory does not grow with every page it has read."""
        mapped = None
        for i in sorted(indices):
            chunk, offset, length, messages, at, count = self.index[i].item()
            if mapped is None or mapped[0] != chunk:
                mapped = (
                    chunk,
                    *(
                        np.load(os.path.join(self.folder, f"{name}-{chunk}.npy"), mmap_mode="r")
                        for name in ("ids", "mask")
                    ),
                )
            ids, mask = (array[offset : offset + length] for array in mapped[1:])
            labels = np.where(mask[1:] != 0, ids[1:], IGNORE_INDEX)
            yield i, Document(ids.tolist(), labels.tolist(), self.turns[at : at + count].tolist(), messages)

    def origin(self, i: int) -> str:
        if self._table is None:
            self._table = records.local_table(self.source)
        return self._table.origin(i)

    def stats(self) -> dict:
        return {"hit": self.hit, "prepare_s": round(self.seconds, 3), "built_s": self.built_s, "folder": self.folder}


class Uncached(Exception):
    """A source the cache does not keep (preference pairs: two documents a record; prompts alone), read as a table
    instead."""


def prepare(cache_dir: str, source: str, field: str, train_on: str, folder: str, processes: int = 0) -> Tokens:
    """The cache of local table `source` tokenized with the tokenizer of `folder`: opened when complete (a hit),
    else built here or, when another process holds the lock, waited for. A bad record raises its DataError."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):  # multiprocessing's own test (spawn.py)
        raise DataError(
            "a token cache build process imported a main module that opens the data again: guard "
            "the script's entry with `if __name__ == '__main__':`"
        )
    start = time.perf_counter()
    try:
        final = os.path.join(cache_dir, key(cache_dir, source, field, train_on, folder))
        found = _open(final, source)
        hit = found is not None
        if not hit:
            with _locked(final + ".lock"):
                found = _open(final, source)  # built while this one waited
                hit = found is not None
                if not hit:
                    shutil.rmtree(final, ignore_errors=True)  # cut short, if there at all
                    _clean(cache_dir)
                    build(final, source, field, train_on, folder, processes)
                    found = _open(final, source)
    except OSError as error:
        raise DataError(f"{cache_dir}: the token cache: {error}") from None
    if found is None:
        raise DataError(f"{final}: another builder renamed an incomplete token cache into place: remove it")
    found.hit, found.seconds = hit, time.perf_counter() - start
    return found


def key(cache_dir: str, source: str, field: str, train_on: str, folder: str) -> str:
    kind, files = records.local_files(source)
    tokenizer = [os.path.join(folder, name) for name in TOKENIZER_FILES if os.path.isfile(os.path.join(folder, name))]
    digests = file_hashes(cache_dir, files + tokenizer)
    try:
        template = tokens.chat_template(folder)[0]
    except DataError:  # a tokenizer without one: text only
        template = None
    code = [hashlib.sha256(Path(module.__file__).read_bytes()).hexdigest() for module in CODE]
    what = {
        "format": FORMAT,
        "files": kind,
        "field": field,
        "train_on": train_on,
        "data": digests[: len(files)],
        "tokenizer": dict(zip(map(os.path.basename, tokenizer), digests[len(files) :])),
        "template": template,
        "code": code,
        "libraries": {name: importlib.metadata.version(name) for name in LIBRARIES},
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def file_hashes(cache_dir: str, paths: list) -> list:
    """Each file's sha256, remembered in hashes.json by (path, size, mtime_ns); under its lock, so of the ranks
    that open a changed set at once one reads each file and the rest take its hash."""
    memo_path = os.path.join(cache_dir, "hashes.json")
    os.makedirs(cache_dir, exist_ok=True)
    with _locked(memo_path + ".lock"):
        memo = json.loads(Path(memo_path).read_text()) if os.path.exists(memo_path) else {}
        digests, changed = [], False
        for path in map(os.path.abspath, paths):
            stat = os.stat(path)
            seen = memo.get(path)
            if not seen or seen[:2] != [stat.st_size, stat.st_mtime_ns]:
                with open(path, "rb") as f:
                    seen = memo[path] = [stat.st_size, stat.st_mtime_ns, hashlib.file_digest(f, "sha256").hexdigest()]
                changed = True
            digests.append(seen[2])
        if changed:
            _write_json(memo_path, memo)
    return digests


def build(final: str, source: str, field: str, train_on: str, folder: str, processes: int = 0, chunk: int = 0) -> None:
    """Every record of `source` tokenized into the cache `final`, chunk by chunk on `processes` processes (0: one
    per core this process may run on, or this process alone for fewer than SERIAL records). Built in a tmp
    folder, renamed into place when complete; nothing is kept when a record is bad (the first by index is named)."""
    began = time.perf_counter()
    table = records.local_table(source)
    kind, count = dataset.kind_of(table.record(0), field, table.origin(0)), len(table)
    if kind == "pair":
        raise Uncached(
            f"{source}: preference pairs are tokenized as they are read (the cache keeps one document a record)"
        )
    if kind == "prompt":
        raise Uncached(f"{source}: prompts alone are rendered as they are answered (the cache keeps trained documents)")
    processes = processes or (1 if count < SERIAL else len(os.sched_getaffinity(0)))
    chunk = chunk or min(CHUNK[1], max(CHUNK[0], -(-count // (8 * processes))))
    spans = [(k, start, min(start + chunk, count)) for k, start in enumerate(range(0, count, chunk))]
    tmp = f"{final}.tmp-{HOST}-{os.getpid()}"
    os.makedirs(tmp)
    args = (source, kind, field, train_on, folder, tmp)
    try:
        if processes == 1 or len(spans) == 1:
            _start(*args)
            parts = [_chunk(span) for span in spans]
        else:
            pool = ProcessPoolExecutor(
                min(processes, len(spans)),
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start,
                initargs=args,
            )
            try:
                parts = list(pool.map(_chunk, spans))  # in order: the first error met is the first bad record's
            finally:
                pool.shutdown(cancel_futures=True)
        _index(tmp, kind, source, parts, time.perf_counter() - began)
        try:
            os.rename(tmp, final)
        except OSError:  # another builder's cache is there (a filesystem whose flock does not span nodes)
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        _WORKER.clear()


_WORKER = {}  # a building process's table, encoder and folder (_start)


def _start(source: str, kind: str, field: str, train_on: str, folder: str, out: str) -> None:
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    encoder = tokens.Encoder(HuggingFaceTokenizer(tokenizer_path=folder), train_on)
    _WORKER.update(table=records.local_table(source), kind=kind, field=field, encoder=encoder, out=out)


def _chunk(span: tuple) -> tuple:
    """Records [start, stop) tokenized into chunk k's two arrays, written here; returns what the index needs:
    (length, messages, turns) per record, the turn starts, and this process's pid."""
    k, start, stop = span
    table, ids, masks, meta, turns = _WORKER["table"], [], [], [], []
    for i in range(start, stop):
        try:
            doc = dataset.tokenize(table.record(i), _WORKER["kind"], _WORKER["field"], _WORKER["encoder"])
        except Problem as problem:
            raise DataError(f"{table.origin(i)}: {problem}") from None
        mask = np.zeros(len(doc.ids), np.uint8)
        mask[1:] = np.asarray(doc.labels, np.int64) != IGNORE_INDEX
        ids.append(np.asarray(doc.ids, np.int32))
        masks.append(mask)
        meta.append((len(doc.ids), doc.messages, len(doc.turns)))
        turns += doc.turns
    np.save(os.path.join(_WORKER["out"], f"ids-{k}.npy"), np.concatenate(ids))
    np.save(os.path.join(_WORKER["out"], f"mask-{k}.npy"), np.concatenate(masks))
    return np.array(meta, np.int64).reshape(-1, 3), np.array(turns, np.int32), os.getpid()


def _index(tmp: str, kind: str, source: str, parts: list, seconds: float) -> None:
    """The index of the chunks' records, then the marker with every file's size (and the build's time)."""
    meta = np.concatenate([part[0] for part in parts])
    index = np.zeros(len(meta), INDEX)
    index["chunk"] = np.repeat(np.arange(len(parts)), [len(part[0]) for part in parts])
    index["offset"] = np.concatenate([np.cumsum(part[0][:, 0]) - part[0][:, 0] for part in parts])
    index["length"], index["messages"], index["turn_count"] = meta.T
    index["turns"] = np.cumsum(meta[:, 2]) - meta[:, 2]
    np.save(os.path.join(tmp, "index.npy"), index)
    np.save(os.path.join(tmp, "turns.npy"), np.concatenate([part[1] for part in parts]))
    sizes = {name: os.path.getsize(os.path.join(tmp, name)) for name in sorted(os.listdir(tmp))}
    _write_json(
        os.path.join(tmp, DONE),
        {
            "format": FORMAT,
            "kind": kind,
            "records": len(index),
            "source": source,
            "writers": sorted({part[2] for part in parts}),
            "sizes": sizes,
            "seconds": round(seconds, 3),
        },
    )


def _open(final: str, source: str) -> Tokens | None:
    """The complete cache in `final`; None when there is none, or it was cut short (no marker, a file missing or
    of another size than the marker says)."""
    try:
        with open(os.path.join(final, DONE)) as f:
            done = json.load(f)
        if done["format"] != FORMAT or any(
            os.path.getsize(os.path.join(final, name)) != size for name, size in done["sizes"].items()
        ):
            return None
        return Tokens(final, source, done)
    except (OSError, ValueError, KeyError):
        return None


def _clean(cache_dir: str) -> None:
    """Remove the tmp folders killed builders left: their pid gone on this host, or untouched for a day."""
    for name in os.listdir(cache_dir):
        found, path = TMP.fullmatch(name), os.path.join(cache_dir, name)
        try:
            if (
                found
                and os.path.isdir(path)
                and (found[1] == HOST and not _alive(int(found[2])) or time.time() - os.path.getmtime(path) > STALE_S)
            ):
                shutil.rmtree(path, ignore_errors=True)
        except FileNotFoundError:  # another builder's clean-up was first
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


@contextlib.contextmanager
def _locked(path: str):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file is closed, or its process dies
        yield


def _write_json(path: str, value) -> None:
    """Written whole or not at all: a reader never sees half of it."""
    tmp = f"{path}.{HOST}-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)
