"""`neuron_qwen3.data.DataLoader`: torchtitan's dataloader for any source this image trains on.

The source is resolved once, when the trainer builds the dataloader: c4 and Hub datasets of text are streamed;
local files, and Hub datasets of conversations (downloaded), are tables read in a seeded order per epoch.
Whether the data is text or conversations is read from its first record. With `cache_dir`, a local table is
tokenized once into the token cache (cache.py), and every rank reads its documents from there. Each rank yields
what torchtitan's trainer expects: ({"input": ids, "positions": per-document positions}, labels with
IGNORE_INDEX where a token does not count), packed by packing.py, and resumes from a checkpoint on the very next
window.
"""

import os
from dataclasses import dataclass
from typing import Literal

import numpy as np
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.tools.logging import logger

from neuron_qwen3.data import cache, mix, records
from neuron_qwen3.data.dataset import PackedDataset, PromptDataset, Shares, kind_of
from neuron_qwen3.data.records import DataError
from neuron_qwen3.data.tokens import TRAIN_ON, Encoder

CACHED = (cache.Tokens, mix.Cached)  # a token cache: documents by index, no record read
TABLES = (records.Table, *CACHED)  # read by index, in a seeded order


def open_source(source: str, config, folder: str) -> tuple:
    """(a Table, the token cache standing in for one, or a stream of records; "text" or "chat") of a source: c4
    and Hub datasets of text are streamed; a local table, or a mix of them (data/mix.py), is read through the
    token cache under `config.cache_dir` when one is set (data/cache.py: tokenized once, with the tokenizer of
    `folder`)."""
    if source == "c4":
        return records.hub_stream(source), "text"
    parts = mix.parse(source)
    if parts:
        opened = [local_source(part.path, config, folder) for part in parts]
        kinds = {part.path: kind for part, (_, kind) in zip(parts, opened)}
        if len(set(kinds.values())) > 1:
            raise DataError(
                f"DATASET={source!r} mixes kinds of records ("
                + ", ".join(f"{path}: {kind}" for path, kind in kinds.items())
                + "): mix one kind"
            )
        tables = [table for table, _ in opened]
        both = mix.Cached(parts, tables) if isinstance(tables[0], CACHED) else mix.Table(parts, tables)
        return both, opened[0][1]
    if records.is_local(source):
        return local_source(source, config, folder)
    stream = records.hub_stream(source)
    first = next(iter(stream), None)
    if first is None:
        raise DataError(f"{source}: the Hub dataset's train split is empty")
    if kind_of(first, config.field, f"{source} row 1") == "text":
        return stream, "text"
    table = records.hub_table(source)
    return table, kind_of(table.record(0), config.field, table.origin(0))


def local_source(source: str, config, folder: str) -> tuple:
    """(the Table of a local file or folder, or its token cache; its kind)."""
    if not os.path.exists(source):
        raise DataError(f"{source}: does not exist")
    if config.cache_dir:
        try:
            tokens = cache.prepare(config.cache_dir, source, config.field, config.train_on, folder)
        except cache.Uncached as why:
            logger.info(f"data: {why}")
        else:
            logger.info(
                f"data: token cache {tokens.folder}: "
                + (
                    "found"
                    if tokens.hit
                    else f"built in {tokens.seconds:.1f} s on {len(tokens.writers)} process"
                    + "es" * (len(tokens.writers) > 1)
                )
            )
            return tokens, tokens.kind
    table = records.local_table(source)
    return table, kind_of(table.record(0), config.field, table.origin(0))


def training_records(config, folder: str) -> tuple:
    """(table, the indices trained on, kind) of a table source: all but those a VALIDATION fraction holds out."""
    table, found = open_source(config.source, config, folder)
    if not isinstance(table, TABLES):
        raise DataError(
            f"{config.source}: streamed, so EPOCHS and a VALIDATION fraction cannot apply: give a local dataset"
        )
    share = records.fraction(config.validation)
    indices = np.arange(len(table)) if share is None else records.held_out(len(table), share, config.seed)[0]
    return table, indices, found


def validation_records(config, folder: str) -> tuple:
    """(table, the indices validated on, kind): a VALIDATION fraction's held-out records, or a file's."""
    share = records.fraction(config.validation)
    if share is None:
        if not os.path.exists(config.validation):
            raise DataError(f"VALIDATION={config.validation!r}: no such file or folder (nor a fraction like 0.05)")
        table, found = open_source(config.validation, config, folder)
        return table, np.arange(len(table)), found
    table, found = open_source(config.source, config, folder)
    if not isinstance(table, TABLES):
        raise DataError(
            f"{config.source}: streamed, so VALIDATION={config.validation} cannot hold records out: "
            "give a local dataset, or a VALIDATION file"
        )
    return table, records.held_out(len(table), share, config.seed)[1], found


def open_reader(config, rank: int, world: int, folder: str) -> tuple:
    """(this rank's reader, "text" or "chat") of the training records."""
    if config.validation or config.epochs:
        table, indices, found = training_records(config, folder)
    else:
        table, found = open_source(config.source, config, folder)
        if not isinstance(table, TABLES):
            return records.StreamReader(table, config.source, rank, world), found
        indices = np.arange(len(table))
    return table_reader(table, mix.order(table, indices, config.seed, rank, world)), found


def table_reader(table, order: records.Order) -> records.TableReader:
    """A reader of `table`'s records, or of a token cache's indices only."""
    return records.TableReader(table, order, read=not isinstance(table, CACHED))


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
    if (
        folder
        and os.path.abspath(folder) != os.path.abspath(tokenizer.tokenizer_path)
        and os.path.isfile(os.path.join(folder, "tokenizer.json"))
    ):
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

        prompts: int = 0
        """Prompt-only records (METHOD=grpo): the prompts a batch holds, a step's on this rank; set by the trainer
        (finish.py)"""

        cache_dir: str = ""
        """The token cache of local tables (neuron_qwen3/data/cache.py): each record tokenized once, in
        parallel, for every rank and every later run; the launcher sets CACHE_DIR/tokens. Empty: tokenized as
        read, on every rank, in every run"""

        def __post_init__(self) -> None:
            if self.train_on not in TRAIN_ON:
                raise ValueError(f"dataloader.train_on={self.train_on!r} is not one of {', '.join(TRAIN_ON)}")
            if self.epochs < 0:
                raise ValueError(f"dataloader.epochs={self.epochs} is not 0 (off) or a positive number of epochs")

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer,
        seq_len: int,
        local_batch_size: int,
        snapshot_every_n_steps: int | None = 1,
        **kwargs,
    ):
        tokenizer = own_tokenizer(tokenizer, config.tokenizer_folder)
        pad = tokenizer.eos_id if tokenizer.eos_id is not None else 0
        encoder = Encoder(tokenizer, config.train_on)
        collate = None  # torch's: windows stacked
        if config.split == "validation":
            table, indices, found = validation_records(config, tokenizer.tokenizer_path)
            reader = table_reader(table, records.Order(indices, config.seed, 0, 1))  # the whole set, each rank
            dataset = Shares(
                PackedDataset(
                    reader, found, config.field, encoder, seq_len, pad, infinite=False, tokens=cached(reader)
                ),
                dp_rank,
                dp_world_size,
                local_batch_size,
            )
            logger.info(
                f"data: validation: {len(indices)} records of {len(table)} in "
                f"{config.source if records.fraction(config.validation) else config.validation}"
            )
        else:
            reader, found = open_reader(config, dp_rank, dp_world_size, tokenizer.tokenizer_path)
            share = (
                f", {reader.per_epoch} of {len(reader.table)} records per epoch on this rank"
                if isinstance(reader, records.TableReader)
                else " (streamed)"
            )
            logger.info(
                f"data: {config.source}: {found}{share}, field {config.field!r}"
                + (f", train_on={config.train_on}" if found == "chat" else "")
                + (f", {config.epochs} epochs" if config.epochs else "")
            )
            if found == "prompt":  # METHOD=grpo: a batch is the step's prompts, answered by the generator
                if config.prompts < 1:
                    raise DataError(f"DATASET: {config.source} holds prompt-only records: train them with METHOD=grpo")
                dataset, local_batch_size = PromptDataset(reader, config.infinite), config.prompts
                collate = list  # the records as read
            else:
                dataset = PackedDataset(
                    reader,
                    found,
                    config.field,
                    encoder,
                    seq_len,
                    pad,
                    config.infinite,
                    config.epochs,
                    tokens=cached(reader),
                )
        self.cache = cached(reader).stats() if cached(reader) else None
        super().__init__(
            dataset,
            dp_rank=dp_rank,
            dp_world_size=dp_world_size,
            num_workers=config.num_workers,
            persistent_workers=config.persistent_workers,
            pin_memory=config.pin_memory,
            prefetch_factor=config.prefetch_factor,
            snapshot_every_n_steps=snapshot_every_n_steps,
            batch_size=local_batch_size,
            collate_fn=collate,
        )

    def stats(self) -> dict:
        """What this rank has read so far, for the run report: kind, epoch, records, turns, tokens_trained,
        tokens_masked, tokens_padding, truncated, split, tokens_cut (in the main process: num_workers=0); and
        cache: {hit, prepare_s, built_s, folder} of the token cache it reads (hit: built before this loader opened
        it; prepare_s: the key, the open, and any build or wait; built_s: the build, whoever built it), None without
        one; a mix's `sources`: {path: {records, tokens_trained}}."""
        return {**self.dataset.stats(), "cache": self.cache}


def cached(reader):
    """The token cache a reader reads indices of (cache.Tokens, or a mix's mix.Cached), or None (a stream, or a
    table read record by record)."""
    table = getattr(reader, "table", None)
    return table if isinstance(table, CACHED) else None
