"""DATASET and DATASET_FIELD: c4, a Hub dataset, or local files, into torchtitan 0.3.0's own loaders.

Plain text goes through `HuggingFaceTextDataLoader` (documents packed into `seq_len` windows), registered in its
`DATASETS` table under one name, as torchtitan's docs/datasets.md asks. Records whose field holds a chat
`messages` list (role/content) go through `ChatDataLoader`, the loader of torchtitan's SFT recipes: the tokenizer's
chat template, prompt tokens masked out of the loss with IGNORE_INDEX, greedy packing. Its ChatDataset takes one
user turn and one assistant turn per record. Local files are read offline by the `datasets` builders (json,
parquet, text); a folder means every supported file in it, of one kind.
"""

import os
from functools import partial

from datasets import load_dataset
from torchtitan.hf_datasets import DatasetConfig
from torchtitan.hf_datasets.text_datasets import DATASETS, ChatDataLoader, HuggingFaceTextDataLoader

DATASET_ENV, FIELD_ENV = "DATASET", "DATASET_FIELD"  # the launcher's contract names (entrypoint/contract.py)
DEFAULT_FIELD = "text"
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
REGISTERED = "neuron_qwen3_dataset"  # the name the text loader finds in torchtitan's DATASETS


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


def source(dataset: str) -> tuple[str, dict]:
    """`load_dataset` arguments of DATASET: a local file or folder, else a Hub dataset id (streamed)."""
    if os.path.exists(dataset):
        builder, files = local_files(dataset)
        return builder, {"data_files": files, "split": "train"}
    return dataset, {"split": "train", "streaming": True}


def is_chat(record: dict, field: str) -> bool:
    value = record.get(field)
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


def messages(sample: dict, field: str) -> list:
    """ChatDataset's sample processor: the record's role/content list."""
    return [{"role": m["role"], "content": m["content"]} for m in sample[field]]


def text(sample: dict, field: str) -> str:
    return sample[field]


def first_record(path: str, kwargs: dict) -> dict:
    return next(iter(load_dataset(path, **{**kwargs, "streaming": True})))


def dataloader_config(dataset: str, field: str):
    """The torchtitan dataloader config for DATASET / DATASET_FIELD (registers a text dataset when needed)."""
    if dataset == "c4":
        return HuggingFaceTextDataLoader.Config(dataset="c4")
    path, kwargs = source(dataset)
    if is_chat(first_record(path, kwargs), field):
        kwargs = {k: v for k, v in kwargs.items() if k != "streaming"}  # ChatDataset shuffles a map-style set
        return ChatDataLoader.Config(dataset_path=path, load_dataset_kwargs=kwargs,
                                     sample_processor=partial(messages, field=field))
    DATASETS[REGISTERED] = DatasetConfig(path=dataset, loader=lambda _: load_dataset(path, **kwargs),
                                         sample_processor=partial(text, field=field))
    return HuggingFaceTextDataLoader.Config(dataset=REGISTERED, dataset_path=dataset)


def from_env(default, environ=os.environ):
    """The dataloader config of DATASET; unset, `default` (c4 at full scale, the bundled corpus at smoke). Called
    by the config functions, so `--dataloader.*` arguments still apply on top."""
    dataset = environ.get(DATASET_ENV)
    if not dataset:
        return default
    return dataloader_config(dataset, environ.get(FIELD_ENV) or DEFAULT_FIELD)
