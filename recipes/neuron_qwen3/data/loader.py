"""`neuron_qwen3.data.DataLoader`: torchtitan's dataloader for any source this image trains on.

The source is resolved once, when the trainer builds the dataloader: c4 and Hub datasets of text are streamed;
local files, and Hub datasets of conversations (downloaded), are tables read in a seeded order per epoch.
Whether the data is text or conversations is read from its first record. Each rank yields what torchtitan's
trainer expects: ({"input": ids, "positions": per-document positions}, labels with IGNORE_INDEX where a token
does not count), packed by packing.py, and resumes from a checkpoint on the very next window.
"""

import os
from dataclasses import dataclass
from typing import Literal

import numpy as np
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.tools.logging import logger

from neuron_qwen3.data import records
from neuron_qwen3.data.conversations import Problem, kind
from neuron_qwen3.data.dataset import PackedDataset, Shares
from neuron_qwen3.data.records import DataError
from neuron_qwen3.data.tokens import TRAIN_ON, Encoder


def open_source(source: str, field: str) -> tuple:
    """(a Table or a stream of records, "text" or "chat") of a source: c4 and Hub datasets of text are streamed."""
    if source == "c4":
        return records.hub_stream(source), "text"
    if records.is_local(source):
        if not os.path.exists(source):
            raise DataError(f"{source}: does not exist")
        table = records.local_table(source)
    else:
        stream = records.hub_stream(source)
        first = next(iter(stream), None)
        if first is None:
            raise DataError(f"{source}: the Hub dataset's train split is empty")
        if _kind(first, field, f"{source} row 1") == "text":
            return stream, "text"
        table = records.hub_table(source)
    return table, _kind(table.record(0), field, table.origin(0))


def training_records(config) -> tuple:
    """(table, the indices trained on, kind) of a table source: all but those a VALIDATION fraction holds out."""
    table, found = open_source(config.source, config.field)
    if not isinstance(table, records.Table):
        raise DataError(f"{config.source}: streamed, so EPOCHS and a VALIDATION fraction cannot apply: give a "
                        "local dataset")
    share = records.fraction(config.validation)
    indices = np.arange(len(table)) if share is None else records.held_out(len(table), share, config.seed)[0]
    return table, indices, found


def validation_records(config) -> tuple:
    """(table, the indices validated on, kind): a VALIDATION fraction's held-out records, or a file's."""
    share = records.fraction(config.validation)
    if share is None:
        if not os.path.exists(config.validation):
            raise DataError(f"VALIDATION={config.validation!r}: no such file or folder (nor a fraction like 0.05)")
        table, found = open_source(config.validation, config.field)
        return table, np.arange(len(table)), found
    table, found = open_source(config.source, config.field)
    if not isinstance(table, records.Table):
        raise DataError(f"{config.source}: streamed, so VALIDATION={config.validation} cannot hold records out: "
                        "give a local dataset, or a VALIDATION file")
    return table, records.held_out(len(table), share, config.seed)[1], found


def open_reader(config, rank: int, world: int) -> tuple:
    """(this rank's reader, "text" or "chat") of the training records."""
    if config.validation or config.epochs:
        table, indices, found = training_records(config)
    else:
        table, found = open_source(config.source, config.field)
        if not isinstance(table, records.Table):
            return records.StreamReader(table, config.source, rank, world), found
        indices = np.arange(len(table))
    return records.TableReader(table, records.Order(indices, config.seed, rank, world)), found


def _kind(record: dict, field: str, origin: str) -> str:
    try:
        return kind(record, field)
    except Problem as problem:
        raise DataError(f"{origin}: {problem}") from None


def tokenizer_of(config) -> str:
    """The folder whose tokenizer and chat template render the data of a trainer `config`: dataloader.
    tokenizer_folder when set, else INIT_FROM's (`checkpoint.initial_load_path` in HF form) when it holds a
    tokenizer (a fine-tuned model keeps its own template), else hf_assets_path, the trainer's own tokenizer."""
    chosen = getattr(config.dataloader, "tokenizer_folder", "")
    source = config.checkpoint.initial_load_path if config.checkpoint.initial_load_in_hf else None
    if not chosen and source and os.path.isfile(os.path.join(source, "tokenizer.json")):
        chosen = source
    return chosen or config.hf_assets_path


def own_tokenizer(tokenizer, folder: str):
    """The tokenizer of `folder` when it is another folder than the trainer's and has one, else the trainer's."""
    if folder and os.path.abspath(folder) != os.path.abspath(tokenizer.tokenizer_path) \
            and os.path.isfile(os.path.join(folder, "tokenizer.json")):
        logger.info(f"data: tokenizer and chat template of {folder}")
        return type(tokenizer)(tokenizer_path=folder)
    return tokenizer


class DataLoader(ParallelAwareDataloader):
    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        source: str = "c4"
        """`c4`, a Hub dataset id, or a local .jsonl, .json, .parquet or .txt file, or a folder of one kind"""

        field: str = "text"
        """The record field holding the text, or the conversation (`messages` role/content, ShareGPT
        `conversations` from/value); a record without it that holds `prompt` and `completion` is one turn"""

        train_on: Literal["assistant", "last", "all"] = "assistant"
        """Conversations: which tokens count in the loss (neuron_qwen3/data/tokens.py)"""

        infinite: bool = True
        """Start the data again (reshuffled) when it runs out"""

        seed: int = 42
        """The order of each epoch: the same on every rank and every restart"""

        validation: str = ""
        """Held out for validation: a fraction like 0.05 of this source's records (drawn with `seed`, never
        trained on) or a local file or folder; the trainer points torchtitan's validator at it. Empty: none"""

        split: Literal["train", "validation"] = "train"
        """What this loader reads: the records trained on, or (the validator's loader) the validation set, whole
        and once, each rank its share of the packed windows, padded to the same number of batches"""

        epochs: int = 0
        """N > 0: exactly N passes over a local dataset, each in its own seeded order, then windows that count
        for nothing; the trainer derives training.steps from the packed data (data/epochs.py)"""

        tokenizer_folder: str = ""
        """A model folder whose tokenizer and chat template render the data; empty: INIT_FROM's folder when it
        has a tokenizer, else the trainer's (hf_assets_path); set by the trainer before it builds the loader"""

        def __post_init__(self) -> None:
            if self.train_on not in TRAIN_ON:
                raise ValueError(f"dataloader.train_on={self.train_on!r} is not one of {', '.join(TRAIN_ON)}")
            if self.epochs < 0:
                raise ValueError(f"dataloader.epochs={self.epochs} is not 0 (off) or a positive number of epochs")

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, tokenizer, seq_len: int,
                 local_batch_size: int, snapshot_every_n_steps: int | None = 1, **kwargs):
        tokenizer = own_tokenizer(tokenizer, config.tokenizer_folder)
        pad = tokenizer.eos_id if tokenizer.eos_id is not None else 0
        encoder = Encoder(tokenizer, config.train_on)
        if config.split == "validation":
            table, indices, found = validation_records(config)
            whole = records.TableReader(table, records.Order(indices, config.seed, 0, 1))
            dataset = Shares(PackedDataset(whole, found, config.field, encoder, seq_len, pad, infinite=False),
                             dp_rank, dp_world_size, local_batch_size)
            logger.info(f"data: validation: {len(indices)} records of {len(table)} in "
                        f"{config.source if records.fraction(config.validation) else config.validation}")
        else:
            reader, found = open_reader(config, dp_rank, dp_world_size)
            share = f", {reader.per_epoch} of {len(reader.table)} records per epoch on this rank" \
                if isinstance(reader, records.TableReader) else " (streamed)"
            logger.info(f"data: {config.source}: {found}{share}, field {config.field!r}"
                        + (f", train_on={config.train_on}" if found == "chat" else "")
                        + (f", {config.epochs} epochs" if config.epochs else ""))
            dataset = PackedDataset(reader, found, config.field, encoder, seq_len, pad, config.infinite,
                                    config.epochs)
        super().__init__(dataset, dp_rank=dp_rank, dp_world_size=dp_world_size, num_workers=config.num_workers,
                         persistent_workers=config.persistent_workers, pin_memory=config.pin_memory,
                         prefetch_factor=config.prefetch_factor, snapshot_every_n_steps=snapshot_every_n_steps,
                         batch_size=local_batch_size)

    def stats(self) -> dict:
        """What this rank has read so far, for the run report: kind, epoch, records, turns, tokens_trained,
        tokens_masked, tokens_padding, truncated, split, tokens_cut (in the main process: num_workers=0)."""
        return self.dataset.stats()
