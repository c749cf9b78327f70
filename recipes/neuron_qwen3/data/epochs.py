"""EPOCHS: how many steps N passes over a local dataset take, counted from the packed data before training.

Each data-parallel rank reads its own share of every epoch's seeded order and packs it (packing.py), so ranks
can end an epoch with different numbers of windows. The run takes as many steps of the global batch as the
rank with the most windows needs; the others fill their last steps with blank windows (dataset.py), which count
for nothing, so every record is trained on exactly N times. The pre-launch pass and every worker call `plan`
with the same config and data-parallel degree, so they derive the same number; with a token cache (cache.py)
from its lengths, in seconds for a million records, and the pre-launch pass's plan builds the cache the workers
then open.
"""

from dataclasses import dataclass, field

from neuron_qwen3.data import mix
from neuron_qwen3.data.conversations import Problem
from neuron_qwen3.data.dataset import documents
from neuron_qwen3.data.loader import CACHED, tokenizer_of, training_records
from neuron_qwen3.data.packing import fit, windows
from neuron_qwen3.data.records import DataError
from neuron_qwen3.data.tokens import Encoder


@dataclass(frozen=True)
class Plan:
    epochs: int
    steps: int
    sequences: int  # per step, over every data-parallel rank (the global batch)
    windows: tuple  # per data-parallel rank, over all epochs
    cache: dict | None = field(default=None, compare=False)  # the token cache's stats, when the plan read one

    @property
    def line(self) -> str:
        return f"{self.epochs} epochs = {self.steps} steps of {self.sequences} sequences"

    @property
    def cache_line(self) -> str | None:
        if self.cache is None:
            return None
        how = "found" if self.cache["hit"] else f"built in {self.cache['prepare_s']:.1f} s"
        folders = self.cache["folder"]  # a mix: one per source
        return f"token cache: {how} ({folders if isinstance(folders, str) else ', '.join(folders)})"


def global_batch(training, dp: int) -> int:
    """torchtitan's global batch in sequences: training.global_batch_size, or one local batch per rank."""
    return training.global_batch_size if training.global_batch_size > 0 else training.local_batch_size * dp


def plan(config, dp: int) -> Plan:
    """The steps of `config.dataloader.epochs` epochs on `dp` data-parallel ranks (a trainer config)."""
    loader, seq_len = config.dataloader, config.training.seq_len
    table, indices, kind = training_records(loader, tokenizer_of(config))
    per = label_counts(table, indices, kind, config)
    per_rank = global_batch(config.training, dp) // dp
    counts = tuple(
        sum(
            windows(
                [per[i] for i in mix.order(table, indices, loader.seed, rank, dp).epoch(e).tolist()],
                seq_len,
                kind != "text",
                kind == "pair",
            )
            for e in range(loader.epochs)
        )
        for rank in range(dp)
    )
    return Plan(
        loader.epochs,
        max(-(-count // per_rank) for count in counts),
        global_batch(config.training, dp),
        counts,
        table.stats() if isinstance(table, CACHED) else None,
    )


def label_counts(table, indices, kind: str, config) -> list:
    """The label count of each window-sized document of each record of `indices` (a list by record index). From
    a token cache (a mix's too), a record's count is its tokens less one, and only a conversation longer than
    seq_len is read and fit; else every record is read and tokenized, on this one core."""
    loader, seq_len = config.dataloader, config.training.seq_len
    if isinstance(table, CACHED):
        labels = table.labels
        per = [(n,) for n in labels.tolist()]
        for i, doc in table.documents(indices[labels[indices] > seq_len] if kind == "chat" else []):
            per[i] = [len(piece.labels) for piece in fit(doc, seq_len)[0]]
        return per
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    encoder = Encoder(HuggingFaceTokenizer(tokenizer_path=tokenizer_of(config)), loader.train_on)
    per = [()] * len(table)
    for i in indices.tolist():
        try:
            _, docs, _ = documents(table.record(i), kind, loader.field, encoder, seq_len)
        except Problem as problem:
            raise DataError(f"{table.origin(i)}: {problem}") from None
        per[i] = [len(doc.labels) for doc in docs]
    return per
