"""One rank's stream of packed windows: records (which, in what order) -> documents (tokens, mask) -> windows.

Stateful for torchtitan's checkpoints: the reader's position, the packer's buffer and the counts, so a resumed
run yields the very windows the first one would have. `counts` is a clean account of what this rank has read.
"""

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.tools.logging import logger

from neuron_qwen3.data import conversations, pairs
from neuron_qwen3.data.conversations import Problem
from neuron_qwen3.data.packing import Packer, fit
from neuron_qwen3.data.records import DataError
from neuron_qwen3.data.tokens import Document, Encoder

COUNTS = ("records", "turns", "tokens_trained", "tokens_masked", "truncated", "split", "dropped", "tokens_cut")
LOGGED_CUTS = 3  # conversations cut that are named in the log; every one is counted


def kind_of(record: dict, field: str, origin: str) -> str:
    """'text', 'chat' or 'pair', from a source's first record (found at `origin`)."""
    try:
        return conversations.kind(record, field)
    except Problem as problem:
        raise DataError(f"{origin}: {problem}") from None


def tokenize(record: dict, kind: str, field: str, encoder: Encoder) -> Document | tuple:
    """The record's document (a pair's two): what the token cache keeps (data/cache.py), as it does not depend
    on seq_len."""
    if kind == "text":
        return encoder.text(conversations.text(record, field))
    if kind == "pair":
        return pairs.encode(pairs.pair(record), encoder)
    return encoder.chat(*conversations.conversation(record, field))


def pieces(doc: Document | tuple, kind: str, seq_len: int) -> tuple[list, str | None]:
    """The window-sized documents a record's document becomes and how it was cut: text flows from window to
    window as it is, a conversation is fit to one, a preference pair goes whole into one window or is dropped
    (cut, its chosen and rejected would not be the answers compared)."""
    if kind == "pair":
        fits = sum(len(d.labels) for d in doc) <= seq_len
        return (list(doc), None) if fits else ([], "dropped")
    return ([doc], None) if kind == "text" else fit(doc, seq_len)


def documents(record: dict, kind: str, field: str, encoder: Encoder, seq_len: int):
    """(the record's document, the window-sized documents it becomes, how it was cut or None); Problem if bad."""
    doc = tokenize(record, kind, field, encoder)
    return doc, *pieces(doc, kind, seq_len)


def blank(seq_len: int, pad_id: int, records: bool = False):
    """A window that counts for nothing (every label IGNORE_INDEX): what a rank yields once its data has ended, so
    every rank takes part in every step (the loss divides by the tokens that count, summed over the ranks)."""
    window = {
        "input": torch.full((seq_len,), pad_id),
        "positions": torch.arange(seq_len),
        "real": torch.zeros(seq_len, dtype=torch.bool),
    }
    if records:  # as the pairs' windows it is batched with (packing.py)
        window["record"] = torch.full((seq_len,), -1)
    return window, torch.full((seq_len,), IGNORE_INDEX)


def without_real(window):
    """A window for torchtitan's Validator, which passes every input but the tokens to the model."""
    inputs, labels = window
    return {key: value for key, value in inputs.items() if key != "real"}, labels


def count(counts: dict, doc, docs: list, cut: str | None) -> None:
    whole = doc if isinstance(doc, tuple) else (doc,)  # a pair's two documents
    kept = sum(len(d.labels) for d in docs)
    trained = sum(d.trained for d in docs)
    counts["records"] += 1
    counts["turns"] += sum(d.messages for d in whole)
    counts["tokens_trained"] += trained
    counts["tokens_masked"] += kept - trained
    if cut:
        counts[cut] += 1
        counts["tokens_cut"] += sum(len(d.labels) for d in whole) - kept


class PackedDataset(IterableDataset, Stateful):
    """`tokens`: the token cache (data/cache.py) the reader's indices are read from; None: each record is read
    and tokenized here."""

    def __init__(
        self,
        reader,
        kind: str,
        field: str,
        encoder: Encoder,
        seq_len: int,
        pad_id: int,
        infinite: bool,
        epochs: int = 0,
        tokens=None,
    ):
        self.reader, self.kind, self.field, self.encoder, self.tokens = reader, kind, field, encoder, tokens
        self.seq_len, self.pad_id, self.infinite, self.epochs = seq_len, pad_id, infinite, epochs
        self.packer = Packer(seq_len, pad_id, whole=kind != "text", records=kind == "pair")
        self.counts = dict.fromkeys(COUNTS, 0)
        self.sources = getattr(getattr(reader, "table", None), "sources", None)  # a mix's (data/mix.py)
        self.by_source = [[0, 0] for _ in self.sources.names] if self.sources else None  # records, tokens trained

    def __iter__(self):
        while True:
            if self.epochs and self.reader.epoch >= self.epochs:  # EPOCHS done: blanks to the derived last step
                yield blank(self.seq_len, self.pad_id, self.kind == "pair")
                continue
            window = self.packer.pop()
            if window is not None:
                yield window
                continue
            item = self.reader.next()
            if item is not None:
                docs = self._documents(*item)
                for k, doc in enumerate(docs):  # a pair: the rejected goes in the chosen's window
                    room = sum(len(d.labels) for d in docs[k + 1 :]) if self.kind == "pair" else 0
                    self.packer.push(doc, room, record=item[0])
                continue
            window = self.packer.flush()  # the epoch ends with the rest of its data, padded
            if window is not None:
                yield window
                continue
            self._log_epoch()
            if not self.infinite and not self.epochs:
                return
            self.reader.next_epoch()

    def _documents(self, i: int, record: dict | None) -> list:
        try:
            doc = self.tokens.document(i) if self.tokens else tokenize(record, self.kind, self.field, self.encoder)
        except Problem as problem:
            raise DataError(f"{self.reader.origin(i)}: {problem}") from None
        docs, cut = pieces(doc, self.kind, self.seq_len)
        count(self.counts, doc, docs, cut)
        if self.by_source:
            mine = self.by_source[self.sources.of(i)]
            mine[0] += 1
            mine[1] += sum(d.trained for d in docs)
        if cut and self.counts["truncated"] + self.counts["split"] + self.counts["dropped"] <= LOGGED_CUTS:
            how = {
                "truncated": "truncated at a turn boundary",
                "split": "split (no turn boundary fits)",
                "dropped": "the pair dropped",
            }[cut]
            size = sum(len(d.labels) for d in doc) if isinstance(doc, tuple) else len(doc.ids)
            logger.warning(
                f"{self.reader.origin(i)}: {size} tokens, longer than seq_len {self.seq_len}: {how}; "
                f"{self.counts['truncated']} truncated, {self.counts['split']} split and "
                f"{self.counts['dropped']} pairs dropped so far (all are counted in each epoch's summary)"
            )
        return docs

    def _log_epoch(self) -> None:
        c = self.counts
        logger.info(
            f"data: epoch {self.reader.epoch} read: {c['records']} records, {c['turns']} turns, "
            f"{c['tokens_trained']} tokens trained, {c['tokens_masked']} masked, {self.packer.padding} "
            f"padding; longer than seq_len {self.seq_len}: {c['truncated']} truncated at a turn boundary, "
            f"{c['split']} split, {c['dropped']} pairs dropped ({c['tokens_cut']} tokens left out)"
        )

    def stats(self) -> dict:
        """What this rank has read; a mix's also by source ({path: {records, tokens_trained}})."""
        found = {"kind": self.kind, "epoch": self.reader.epoch, **self.counts, "tokens_padding": self.packer.padding}
        if self.by_source:
            found["sources"] = {
                name: {"records": n, "tokens_trained": trained}
                for name, (n, trained) in zip(self.sources.names, self.by_source)
            }
        return found

    def state_dict(self) -> dict:
        return {
            "reader": self.reader.state_dict(),
            "packer": self.packer.state_dict(),
            "counts": dict(self.counts),
            **({"by_source": [list(pair) for pair in self.by_source]} if self.by_source else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        self.reader.load_state_dict(state["reader"])
        self.packer.load_state_dict(state["packer"])
        self.counts = dict(state["counts"])
        if self.by_source:
            self.by_source = [list(pair) for pair in state["by_source"]]


class PromptDataset(IterableDataset, Stateful):
    """Prompt-only records (METHOD=grpo), each `(origin, record)` as read: the generator renders and answers them
    (rl/rollout.py), so nothing is tokenized or packed here. The reader's position is the state."""

    def __init__(self, reader, infinite: bool):
        self.reader, self.infinite, self.records = reader, infinite, 0

    def __iter__(self):
        while True:
            item = self.reader.next()
            if item is not None:
                self.records += 1
                yield self.reader.origin(item[0]), item[1]
                continue
            logger.info(f"data: epoch {self.reader.epoch} read: {self.records} prompts")
            if not self.infinite:
                return
            self.reader.next_epoch()

    def stats(self) -> dict:
        found = {**dict.fromkeys(COUNTS, 0), "tokens_padding": 0}  # tokens are the rollout's, not read here
        return {"kind": "prompt", "epoch": self.reader.epoch, **found, "records": self.records}

    def state_dict(self) -> dict:
        return {"reader": self.reader.state_dict(), "records": self.records}

    def load_state_dict(self, state: dict) -> None:
        self.reader.load_state_dict(state["reader"])
        self.records = state["records"]


class Shares(IterableDataset):
    """The validation set, whole, once, for torchtitan's Validator: every rank packs all of it alike (`packed`,
    one pass) and keeps every `world`-th window from its `rank`, then adds blank windows up to the same number of
    full batches on every rank, so the validator's per-batch all-reduce never waits on a rank that ran out, and
    1 rank and N ranks evaluate the very same windows."""

    def __init__(self, packed: PackedDataset, rank: int, world: int, batch: int):
        self.packed, self.rank, self.world, self.batch = packed, rank, world, batch

    def __iter__(self):
        total = mine = 0
        for window in self.packed:
            if total % self.world == self.rank:
                mine += 1
                yield without_real(window)
            total += 1
        share = -(-total // self.world)
        for _ in range(-(-share // self.batch) * self.batch - mine):
            yield without_real(blank(self.packed.seq_len, self.packed.pad_id, self.packed.kind == "pair"))

    def stats(self) -> dict:
        return self.packed.stats()
