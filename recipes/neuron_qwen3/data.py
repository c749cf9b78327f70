"""The training data: `--dataloader.source` (c4, a Hub dataset, or local files) and `--dataloader.field`.

`DataLoader` is a torchtitan dataloader whose source is resolved once, when the trainer builds it (never while a
config function runs). Plain text goes through torchtitan's HuggingFaceTextDataset (documents packed into
`seq_len` windows, positions restarting per document); records whose field holds a chat `messages` list
(role/content) go through torchtitan's ChatDataset (the tokenizer's chat template, prompt tokens masked out of the
loss with IGNORE_INDEX, greedy packing). Local files are read offline by the `datasets` builders (json, parquet,
text); a folder means every supported file in it, of one kind.
"""

import os
from dataclasses import dataclass
from functools import partial

from datasets import load_dataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.hf_datasets import DatasetConfig
from torchtitan.hf_datasets.text_datasets import DATASETS, ChatDataset, HuggingFaceTextDataset

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}


def local_files(path: str) -> tuple[str, list]:
    """(datasets builder, files) of a supported file or a folder of them; ValueError otherwise."""
    if os.path.isdir(path):
        files = sorted(os.path.join(path, name) for name in os.listdir(path)
                       if os.path.splitext(name)[1] in BUILDERS)
    else:
        files = [path]
    builders = {BUILDERS.get(os.path.splitext(name)[1]) for name in files}
    if not files or None in builders or len(builders) > 1:
        raise ValueError(f"{path}: not a {', '.join(BUILDERS)} file or a folder of one kind of them")
    return builders.pop(), files


def load_arguments(source: str) -> tuple[str, dict]:
    """`load_dataset` arguments of a source: a local file or folder, else a Hub dataset id (streamed)."""
    if os.path.exists(source):
        builder, files = local_files(source)
        return builder, {"data_files": files, "split": "train"}
    return source, {"split": "train", "streaming": True}


def is_chat(record: dict, field: str) -> bool:
    value = record.get(field)
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


def messages(sample: dict, field: str) -> list:
    """ChatDataset's sample processor: the record's role/content list."""
    return [{"role": m["role"], "content": m["content"]} for m in sample[field]]


def text(sample: dict, field: str) -> str:
    return sample[field]


class DataLoader(ParallelAwareDataloader):
    """torchtitan's text or chat datasets, chosen from the source's first record when the trainer builds it."""

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        source: str = "c4"
        """`c4` (allenai/c4, streamed), a Hub dataset id, or a local .jsonl, .json, .parquet or .txt file or
        folder (read offline)."""
        field: str = "text"
        """The record field that holds the text; a chat `messages` list there makes the run SFT."""
        infinite: bool = True
        """Loop over the data again when it ends."""

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, tokenizer, seq_len: int,
                 local_batch_size: int, snapshot_every_n_steps: int | None = 1, **kwargs):
        parallel = dict(dp_rank=dp_rank, dp_world_size=dp_world_size)
        if config.source == "c4":
            dataset = HuggingFaceTextDataset("c4", None, tokenizer, seq_len, infinite=config.infinite, **parallel)
        else:
            path, arguments = load_arguments(config.source)
            first = next(iter(load_dataset(path, **{**arguments, "streaming": True})))
            if is_chat(first, config.field):
                arguments.pop("streaming", None)  # ChatDataset shuffles a map-style set
                dataset = ChatDataset(load_dataset(path, **arguments), tokenizer,
                                      partial(messages, field=config.field), seq_len, infinite=config.infinite,
                                      **parallel)
            else:
                # HuggingFaceTextDataset reads its source from torchtitan's table of datasets, by name
                name = "neuron_qwen3_source"  # lower case: torchtitan lowercases the name it looks up
                DATASETS[name] = DatasetConfig(path=config.source, loader=lambda _: load_dataset(path, **arguments),
                                               sample_processor=partial(text, field=config.field))
                dataset = HuggingFaceTextDataset(name, None, tokenizer, seq_len, infinite=config.infinite, **parallel)
        super().__init__(dataset, num_workers=config.num_workers, persistent_workers=config.persistent_workers,
                         pin_memory=config.pin_memory, prefetch_factor=config.prefetch_factor,
                         snapshot_every_n_steps=snapshot_every_n_steps, batch_size=local_batch_size, **parallel)


def first_record(path: str) -> dict | None:
    """The first record of a local source (a file, or the first file of a folder); ValueError naming what is
    wrong when it has none."""
    builder, files = local_files(path)
    if os.path.getsize(files[0]) == 0:
        raise ValueError(f"{files[0]} is empty")
    try:
        return next(iter(load_dataset(builder, data_files=files[:1], split="train", streaming=True)))
    except StopIteration:
        raise ValueError(f"{files[0]} has no records") from None


def scan(source: str, field: str) -> str | None:
    """The first problem of a local source, as one line; None when it can be trained on (or is not local)."""
    if not os.path.exists(source):
        return None
    try:
        record = first_record(source)
    except Exception as error:  # the datasets builders raise many kinds; the first line says what
        return f"{source}: {(str(error).strip().splitlines() or [type(error).__name__])[0]}"
    if field not in record:
        return f"{source}: its first record has no field {field!r} (it has: {', '.join(sorted(record)) or 'none'})"
    value = record[field]
    if isinstance(value, list) and [m.get("role") for m in value if isinstance(m, dict)] != ["user", "assistant"]:
        return (f"{source}: chat records must hold one user and one assistant message (torchtitan 0.3.0's "
                f"ChatDataset), the first holds roles {[m.get('role') if isinstance(m, dict) else m for m in value]}")
    return None
