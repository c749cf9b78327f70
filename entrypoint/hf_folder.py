"""Stdlib reading of what the pre-launch checks need: a Hugging Face model folder and a local dataset's first record.

No torch, no safetensors package: a safetensors file starts with an 8-byte little-endian header length and a JSON
header naming every tensor's dtype and shape, which is all the checks read. Each function raises ValueError with
the reason as one line.
"""

import json
import os

# config.json fields that fix the trained shape: the first that differs is named in the error
SHAPE_FIELDS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "intermediate_size", "num_experts", "num_experts_per_tok",
                "moe_intermediate_size", "tie_word_embeddings")
DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt")


def read_config(folder: str) -> dict:
    path = os.path.join(folder, "config.json")
    if not os.path.isdir(folder):
        raise ValueError(f"{folder} is not a folder")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{folder} has no config.json") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON: {error}") from None


def safetensors_files(folder: str) -> list:
    """The weight files: those the index names, else every *.safetensors; ValueError when there are none."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        absent = [name for name in names if not os.path.isfile(os.path.join(folder, name))]
        if absent:
            raise ValueError(f"{folder}: model.safetensors.index.json names {absent[0]}, which is missing")
    else:
        names = sorted(name for name in os.listdir(folder) if name.endswith(".safetensors"))
    if not names:
        raise ValueError(f"{folder} has no *.safetensors weights")
    return [os.path.join(folder, name) for name in names]


def header(path: str) -> dict:
    """{tensor name: {dtype, shape, data_offsets}} from a safetensors file's JSON header."""
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if not 0 < length < 100 << 20:
            raise ValueError(f"{path} is not a safetensors file")
        found = json.loads(f.read(length))
    found.pop("__metadata__", None)
    return found


def parameter_count(folder: str) -> int:
    count = 0
    for path in safetensors_files(folder):
        for tensor in header(path).values():
            numel = 1
            for size in tensor["shape"]:
                numel *= size
            count += numel
    return count


def first_difference(source: dict, trained: dict) -> tuple | None:
    """(field, source value, trained value) of the first shape field that differs, else None."""
    for name in SHAPE_FIELDS:
        if name in trained and source.get(name) != trained[name]:
            return name, source.get(name), trained[name]
    return None


# ---- datasets ----------------------------------------------------------------------------------------------


def data_file(path: str) -> str:
    """The file whose first record is checked: `path`, or the first supported file of a folder."""
    if os.path.isdir(path):
        files = sorted(name for name in os.listdir(path) if name.endswith(DATA_SUFFIXES))
        if not files:
            raise ValueError(f"{path} holds no {', '.join(DATA_SUFFIXES)} file")
        return os.path.join(path, files[0])
    if not path.endswith(DATA_SUFFIXES):
        raise ValueError(f"{path} is not a {', '.join(DATA_SUFFIXES)} file")
    return path


def first_record(path: str) -> dict | None:
    """The first record of a .jsonl/.json/.txt file ({"text": line} for .txt), None for parquet; ValueError
    when the file is empty."""
    if os.path.getsize(path) == 0:
        raise ValueError(f"{path} is empty")
    if path.endswith(".parquet"):
        return None
    with open(path, encoding="utf-8") as f:
        if path.endswith(".txt"):
            line = next((line for line in f if line.strip()), None)
            if line is None:
                raise ValueError(f"{path} is empty")
            return {"text": line}
        if path.endswith(".json"):
            records = json.load(f)
            records = records if isinstance(records, list) else [records]
        else:
            line = next((line for line in f if line.strip()), None)
            records = [json.loads(line)] if line else []
    if not records or not isinstance(records[0], dict):
        raise ValueError(f"{path} has no records (JSON objects)")
    return records[0]


def parquet_columns_named(path: str, name: str) -> bool:
    """Whether a parquet file's footer names a column `name` (its schema strings are length-prefixed UTF-8)."""
    with open(path, "rb") as f:
        f.seek(-8, os.SEEK_END)
        tail = f.read(8)
        if tail[4:] != b"PAR1":
            raise ValueError(f"{path} is not a parquet file")
        f.seek(-8 - int.from_bytes(tail[:4], "little"), os.SEEK_END)
        footer = f.read(int.from_bytes(tail[:4], "little"))
    encoded = name.encode()
    return bytes([len(encoded)]) + encoded in footer if len(encoded) < 128 else encoded in footer
