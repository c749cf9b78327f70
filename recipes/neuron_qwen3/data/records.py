"""Which records: a source resolved once (c4, a Hub dataset, local files), each record with where it came from.

A table (local files, or a Hub dataset that holds conversations) is read by index, so the order of an epoch is a
seeded permutation, the same on every rank and after every restart (`Order`); a stream (c4, a Hub dataset of text)
is read in its own order. Records are parsed when read, so a bad one is reported with its file and line (or row)
by `DataError`, whose message is one line.
"""

import json
import os
import re
from array import array
from bisect import bisect_right

import numpy as np

KINDS = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".txt": "txt"}
C4 = ("allenai/c4", "en")  # torchtitan's "c4": the English split, streamed


class DataError(ValueError):
    """A data problem in one line: the file and line (or row), and what is wrong."""


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class JsonLines:
    """A .jsonl file (one JSON object a line; blank lines are no records) or a .txt file (a line is {"text": it})."""

    def __init__(self, path: str, text: bool = False):
        self.path, self.text = path, text
        self.starts = array("q")  # byte offset of each record's line
        offset = 0
        with open(path, "rb") as f:
            for line in f:
                if line.strip():
                    self.starts.append(offset)
                offset += len(line)

    def __len__(self):
        return len(self.starts)

    def origin(self, i: int) -> str:
        with open(self.path, "rb") as f:
            line = f.read(self.starts[i]).count(b"\n") + 1
        return f"{self.path}:{line}"

    def record(self, i: int) -> dict:
        with open(self.path, "rb") as f:
            f.seek(self.starts[i])
            raw = f.readline()
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise DataError(f"{self.origin(i)}: not UTF-8 text") from None
        if self.text:
            return {"text": line.rstrip("\r\n")}
        try:
            record = json.loads(line.rstrip("\r\n"))
        except json.JSONDecodeError as error:
            raise DataError(f"{self.origin(i)}: {_invalid(error)}") from None
        if not isinstance(record, dict):
            raise DataError(f"{self.origin(i)}: a record must be a JSON object, not {_short(record)}")
        return record


class JsonArray:
    """A .json file holding one array of records, kept as text; each element is decoded when read."""

    def __init__(self, path: str, text: str):
        self.path, self.source = path, text
        self.starts = array("q")
        decoder, at = json.JSONDecoder(), text.index("[") + 1
        try:
            while True:
                at = _skip_space(text, at)
                if text.startswith("]", at):
                    break
                self.starts.append(at)
                _, at = decoder.raw_decode(text, at)
                at = _skip_space(text, at)
                if text.startswith("]", at):
                    break
                if not text.startswith(",", at):
                    raise json.JSONDecodeError("Expecting ',' delimiter", text, at)
                at += 1
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{error.lineno}: {_invalid(error)}") from None

    def __len__(self):
        return len(self.starts)

    def origin(self, i: int) -> str:
        return f"{self.path}:{self.source.count(chr(10), 0, self.starts[i]) + 1}"

    def record(self, i: int) -> dict:
        record = json.JSONDecoder().raw_decode(self.source, self.starts[i])[0]
        if not isinstance(record, dict):
            raise DataError(f"{self.origin(i)}: a record must be a JSON object, not {_short(record)}")
        return record


def _invalid(error: json.JSONDecodeError) -> str:
    return f"invalid JSON at column {error.colno}: {error.msg.removesuffix(' at')}"


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


def json_file(path: str):
    """A .json file: an array of records, or (as the `datasets` json builder also reads it) JSON lines."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise DataError(f"{path}:1: not UTF-8 text") from None
    return JsonArray(path, text) if text.lstrip().startswith("[") else JsonLines(path)


class Rows:
    """Rows of a parquet file or of a `datasets.Dataset` (a Hub dataset, downloaded), read by index."""

    def __init__(self, name: str, count: int, read):
        self.name, self.count, self.record = name, count, read

    def __len__(self):
        return self.count

    def origin(self, i: int) -> str:
        return f"{self.name} row {i + 1}"


def parquet_file(path: str) -> Rows:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, memory_map=True)
    except (pa.ArrowInvalid, OSError) as error:
        raise DataError(f"{path}: not a parquet file ({str(error).splitlines()[0]})") from None
    return Rows(path, table.num_rows, lambda i: table.slice(i, 1).to_pylist()[0])


def _open(path: str, kind: str):
    if kind == "parquet":
        return parquet_file(path)
    if kind == "json":
        return json_file(path)
    return JsonLines(path, text=kind == "txt")


class Table:
    """Every record of a local file, or of a folder of files of one kind, in file order; or of a Hub dataset."""

    def __init__(self, parts: list):
        self.parts = [part for part in parts if len(part)]
        self.ends = np.cumsum([len(part) for part in self.parts]).tolist()

    def __len__(self):
        return self.ends[-1] if self.ends else 0

    def _locate(self, i: int):
        k = bisect_right(self.ends, i)
        return self.parts[k], i - (self.ends[k - 1] if k else 0)

    def origin(self, i: int) -> str:
        part, j = self._locate(i)
        return part.origin(j)

    def record(self, i: int) -> dict:
        part, j = self._locate(i)
        return part.record(j)


def local_files(path: str) -> tuple[str, list]:
    """(kind, files) of a .jsonl/.json/.parquet/.txt file, or of a folder holding files of one of those kinds."""
    if os.path.isdir(path):
        files = sorted(
            os.path.join(path, name)
            for name in os.listdir(path)
            if os.path.splitext(name)[1] in KINDS and os.path.isfile(os.path.join(path, name))
        )
        kinds = sorted({KINDS[os.path.splitext(name)[1]] for name in files})
        if not kinds:
            raise DataError(f"{path}: holds no {', '.join(KINDS)} file")
        if len(kinds) > 1:
            raise DataError(
                f"{path}: holds {' and '.join('.' + kind for kind in kinds)} files: a folder must hold one kind"
            )
        return kinds[0], files
    suffix = os.path.splitext(path)[1]
    if suffix not in KINDS:
        raise DataError(f"{path}: not a {', '.join(KINDS)} file (or a folder of one kind of them)")
    return KINDS[suffix], [path]


def local_table(path: str) -> Table:
    kind, files = local_files(path)
    table = Table([_open(name, kind) for name in files])
    if not len(table):
        raise DataError(f"{path}: is empty (no records)")
    return table


def is_local(source: str) -> bool:
    return os.path.exists(source) or source.endswith(tuple(KINDS)) or source.startswith(("/", ".", "~"))


def hub_stream(source: str):
    """A Hub dataset's train split as a `datasets` stream (c4: allenai/c4's English split)."""
    from datasets import load_dataset

    path, name = C4 if source == "c4" else (source, None)
    return load_dataset(path, name, split="train", streaming=True)


def hub_table(source: str) -> Table:
    from datasets import load_dataset

    dataset = load_dataset(source, split="train")
    return Table([Rows(source, len(dataset), dataset.__getitem__)])


FRACTION = re.compile(r"0?\.[0-9]*[1-9][0-9]*")  # VALIDATION=0.05: a share of DATASET; anything else is a path
HOLDOUT = 0x5A17  # the held-out draw's third seed word: an epoch's order is seeded by two


def fraction(validation: str) -> float | None:
    """The share of the training source's records a VALIDATION like `0.05` holds out; None: it names a file."""
    return float(validation) if FRACTION.fullmatch(validation) else None


def held_out(count: int, share: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(records trained on, records held out) of a table of `count` records: round(count * share) of them (at
    least one) drawn with `seed`, the same on every rank and every restart; split by record, before packing."""
    held = max(1, round(count * share))
    if held >= count:
        raise DataError(f"VALIDATION={share} of {count} records leaves none to train on")
    mask = np.zeros(count, dtype=bool)
    mask[np.random.default_rng([seed, count, HOLDOUT]).permutation(count)[:held]] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)


class Order:
    """Which records one rank reads in each epoch: a permutation of `indices` seeded by (seed, epoch), the same
    on every rank and every restart, dealt out rank by rank."""

    def __init__(self, indices: np.ndarray, seed: int, rank: int, world: int):
        if len(indices) < world:
            raise DataError(f"{len(indices)} records cannot be shared by {world} data-parallel ranks")
        self.indices, self.seed, self.rank, self.world = indices, seed, rank, world

    def epoch(self, epoch: int) -> np.ndarray:
        shuffled = self.indices[np.random.default_rng([self.seed, epoch]).permutation(len(self.indices))]
        return shuffled[self.rank :: self.world]

    def signature(self) -> list:
        """What else than the record count decides the order, kept in a checkpoint: nothing here (a mix's
        weights, data/mix.py)."""
        return []


class TableReader:
    """One rank's pass over a table: record by record in `order`, epoch after epoch; its position is its state.
    `read=False`: indices only, for a token cache standing in for the table (data/cache.py), whose records are
    neither read nor parsed."""

    def __init__(self, table, order: Order, read: bool = True):
        self.table, self.order, self.read = table, order, read
        self.epoch, self.cursor = 0, 0
        self._ids = order.epoch(0)

    @property
    def per_epoch(self) -> int:
        return len(self._ids)

    def next(self):
        """(index, record or None when not `read`) of the next record of this epoch, None at its end."""
        if self.cursor >= len(self._ids):
            return None
        i = int(self._ids[self.cursor])
        self.cursor += 1
        return i, self.table.record(i) if self.read else None

    def origin(self, i: int) -> str:
        return self.table.origin(i)

    def next_epoch(self) -> None:
        self.epoch, self.cursor = self.epoch + 1, 0
        self._ids = self.order.epoch(self.epoch)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "records": len(self.table), "order": self.order.signature()}

    def load_state_dict(self, state: dict) -> None:
        if state["records"] != len(self.table):
            raise DataError(
                f"the checkpoint was taken on {state['records']} records, the data now holds "
                f"{len(self.table)}: resume on the same data"
            )
        taken = state.get("order", [])  # a checkpoint from before mixes: one source
        if taken != self.order.signature():
            was, now = (",".join(signature) or "one source" for signature in (taken, self.order.signature()))
            raise DataError(f"the checkpoint was taken on the mix {was}, the data now is {now}: resume on the same mix")
        self.epoch, self.cursor = state["epoch"], state["cursor"]
        self._ids = self.order.epoch(self.epoch)


class StreamReader:
    """One rank's share of a stream (`datasets.distributed.split_dataset_by_node`), in the stream's own order."""

    def __init__(self, stream, name: str, rank: int, world: int):
        from datasets.distributed import split_dataset_by_node

        self.data, self.name = split_dataset_by_node(stream, rank, world), name
        self.epoch, self.seen, self._records = 0, 0, None

    def next(self):
        if self._records is None:
            self._records = iter(self.data)
        record = next(self._records, None)
        if record is None:
            return None
        self.seen += 1
        return self.seen, record

    def origin(self, i: int) -> str:
        return f"{self.name} (record {i} of this rank's share, epoch {self.epoch})"

    def next_epoch(self) -> None:
        self.epoch, self.seen, self._records = self.epoch + 1, 0, None
        self.data.set_epoch(self.epoch)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "seen": self.seen, "data": self.data.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.seen, self._records = state["epoch"], state["seen"], None
        self.data.set_epoch(self.epoch)
        self.data.load_state_dict(state["data"])
