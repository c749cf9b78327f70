"""DATASET as a mix: several local sources with weights, `a.jsonl:0.7,b.parquet:0.3`, read as one table.

Each epoch of a mix holds as many records as its sources together hold (less a VALIDATION fraction's), each
source's share by its weight (weights are relative; largest remainders, so the counts sum exactly). A source drawn
more often than it has records repeats, each pass over it in a new seeded order; one drawn less often gives each
epoch the next records of its own seeded stream, so over the epochs every record is read. The epoch's records are
then shuffled together with (seed, epoch): the same on every rank and every restart, so a stopped run resumes
where it was (the reader's epoch and cursor, records.TableReader). EPOCHS counts passes over the mix.

A mix takes local files and folders only: a Hub dataset has no records by index until downloaded (save it to a
file first). The sources must be of one kind (text, or conversations in DATASET_FIELD).
"""

import os
import re
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from neuron_qwen3.data import records
from neuron_qwen3.data.records import DataError

PART = re.compile(r"(?P<path>.+):(?P<weight>[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?|\.[0-9]+([eE][-+]?[0-9]+)?)")
EXAMPLE = "a.jsonl:0.7,b.parquet:0.3"
DRAW = 0x313C  # a source's passes' third seed word: the epoch's shuffle is seeded by two


@dataclass(frozen=True)
class Part:
    path: str
    weight: float


def parse(source: str) -> list[Part] | None:
    """The parts of a mix, in the order given; None: `source` names one source (an existing path is one even when
    its name ends in `:<number>`)."""
    if os.path.exists(source):
        return None
    pieces = source.split(",")
    found = [PART.fullmatch(piece.strip()) for piece in pieces]
    if len(pieces) == 1 and not found[0]:
        return None
    for piece, match in zip(pieces, found):
        if not match:
            raise DataError(
                f"DATASET={source!r}: {piece.strip()!r} has no weight: a mix is path:weight,... like {EXAMPLE}"
            )
        if float(match["weight"]) <= 0:
            raise DataError(f"DATASET={source!r}: {piece.strip()!r}: a weight is a number above 0")
    parts = [Part(match["path"], float(match["weight"])) for match in found]
    paths = [part.path for part in parts]
    for part in parts:
        if not os.path.exists(part.path):
            raise DataError(f"DATASET={source!r}: {part.path} does not exist (a mix takes local files and folders)")
        if paths.count(part.path) > 1:
            raise DataError(
                f"DATASET={source!r}: {part.path} is given twice: give it once, with the sum of its weights"
            )
    return parts


def local_paths(source: str) -> list[str] | None:
    """The local files or folders a DATASET reads (a mix's parts, or the source itself); None: c4 or the Hub."""
    parts = parse(source)
    if parts:
        return [part.path for part in parts]
    return [source] if os.path.exists(source) else None


@dataclass(frozen=True)
class Sources:
    """Which records of a mix's table are whose: source k holds indices [ends[k-1], ends[k])."""

    names: tuple
    weights: tuple
    ends: tuple

    def of(self, i: int) -> int:
        return bisect_right(self.ends, i)


class Table(records.Table):
    """The records of a mix's sources, one after another (each a local file or folder, read as records.Table)."""

    def __init__(self, parts: list[Part], tables: list):
        super().__init__(tables)
        self.sources = Sources(tuple(p.path for p in parts), tuple(p.weight for p in parts), tuple(self.ends))


class Cached:
    """The token caches of a mix's sources (data/cache.py's Tokens), read as one: what a reader, the dataset and
    EPOCHS' plan ask of a cache, by index into the mix."""

    def __init__(self, parts: list[Part], caches: list):
        self.parts, self.kind = caches, caches[0].kind
        ends = np.cumsum([len(c) for c in caches]).tolist()
        self.sources = Sources(tuple(p.path for p in parts), tuple(p.weight for p in parts), tuple(ends))
        self.starts = [0, *ends[:-1]]

    def __len__(self):
        return self.sources.ends[-1]

    @property
    def labels(self) -> np.ndarray:
        return np.concatenate([c.labels for c in self.parts])

    def document(self, i: int):
        k = self.sources.of(i)
        return self.parts[k].document(i - self.starts[k])

    def documents(self, indices):
        """(i, Document) of each of `indices`, in increasing order (cache.Tokens.documents, source by source)."""
        indices = np.sort(np.asarray(indices, dtype=np.int64))
        for k, cached in enumerate(self.parts):
            mine = indices[(indices >= self.starts[k]) & (indices < self.sources.ends[k])]
            for j, doc in cached.documents((mine - self.starts[k]).tolist()):
                yield j + self.starts[k], doc

    def origin(self, i: int) -> str:
        k = self.sources.of(i)
        return self.parts[k].origin(i - self.starts[k])

    def stats(self) -> dict:
        """The caches of the sources, as one: hit when every source's was; the preparation of them all."""
        built = [c.built_s for c in self.parts]
        return {
            "hit": all(c.hit for c in self.parts),
            "prepare_s": round(sum(c.seconds for c in self.parts), 3),
            "built_s": None if None in built else round(sum(built), 3),
            "folder": [c.folder for c in self.parts],
        }


def shares(total: int, weights) -> np.ndarray:
    """`total` records apportioned by `weights` (largest remainders: the counts sum to `total` exactly)."""
    exact = np.asarray(weights, dtype=np.float64) / sum(weights) * total
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(counts - exact, kind="stable")[: total - counts.sum()]] += 1
    return counts


class Order(records.Order):
    """A mix's epochs (records.Order's interface): each source's share of `indices` drawn from its own seeded
    stream of passes, then the epoch shuffled with (seed, epoch) and dealt out rank by rank."""

    def __init__(self, indices: np.ndarray, sources: Sources, seed: int, rank: int, world: int):
        super().__init__(indices, seed, rank, world)
        starts = (0, *sources.ends[:-1])
        self.pools = [indices[(indices >= lo) & (indices < hi)] for lo, hi in zip(starts, sources.ends)]
        for name, pool in zip(sources.names, self.pools):
            if not len(pool):
                raise DataError(f"{name}: every record of this source is held out for validation")
        self.counts = shares(len(indices), sources.weights)
        self.sources = sources

    def signature(self) -> list:
        names, weights = self.sources.names, self.sources.weights
        return [f"{os.path.basename(name)}:{weight:g}" for name, weight in zip(names, weights)]

    def drawn(self, k: int, epoch: int) -> np.ndarray:
        """Source k's records of `epoch`: positions [epoch * c, (epoch + 1) * c) of its stream of passes."""
        pool, count = self.pools[k], int(self.counts[k])
        if not count:
            return pool[:0]
        first, last = epoch * count, (epoch + 1) * count
        passes = range(first // len(pool), (last - 1) // len(pool) + 1)
        stream = np.concatenate(
            [pool[np.random.default_rng([self.seed, k, DRAW, p]).permutation(len(pool))] for p in passes]
        )
        return stream[first - passes[0] * len(pool) : last - passes[0] * len(pool)]

    def epoch(self, epoch: int) -> np.ndarray:
        drawn = np.concatenate([self.drawn(k, epoch) for k in range(len(self.pools))])
        return drawn[np.random.default_rng([self.seed, epoch]).permutation(len(drawn))][self.rank :: self.world]


def order(table, indices: np.ndarray, seed: int, rank: int, world: int) -> records.Order:
    """The order a training table is read in: a mix's (its sources' weights), else records.Order's."""
    sources = getattr(table, "sources", None)
    return Order(indices, sources, seed, rank, world) if sources else records.Order(indices, seed, rank, world)
