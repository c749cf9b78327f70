"""DATASET / DATASET_FIELD: the pre-launch checks (one line, exit 2), the loader chosen, and the SFT masking.

The masking test builds torchtitan's own ChatDataset on the bundled tokenizer and its ChatML-style template and
checks that the tokens counting in the loss are exactly the assistant's reply of a two-turn (user, assistant)
record. The launcher tests stop before torchrun (nothing trains here; tests/test_finetune.py trains).
"""

import json
import subprocess
import sys

import pytest

from conftest import REPO, worker_env

from entrypoint import contract, preflight

ASSISTANT = "Paris is the capital."
RECORD = {"messages": [{"role": "user", "content": "Name the capital of France."},
                       {"role": "assistant", "content": ASSISTANT}]}


def launcher(tmp_path, **env):
    return subprocess.run([sys.executable, "-m", "entrypoint"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env=worker_env(SCALE="smoke", OUTPUT_DIR=str(tmp_path / "out"),
                                         CACHE_DIR=str(tmp_path / "cache"), **env))


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.mark.parametrize("case", ["missing", "empty", "no field", "parquet no field", "hub offline", "three turns"])
def test_bad_dataset_is_one_fatal_line(tmp_path, case):
    path = tmp_path / "data.jsonl"
    if case == "empty":
        path.write_text("")
    elif case == "no field":
        path.write_text(json.dumps({"body": "words"}) + "\n")
    elif case == "parquet no field":
        path = tmp_path / "data.parquet"
        write_parquet(path, [{"body": "words"}])
    elif case == "three turns":
        path.write_text(json.dumps({"messages": RECORD["messages"] * 2}) + "\n")
    dataset = "someone/their-data" if case == "hub offline" else str(path)
    field = "messages" if case == "three turns" else "text"
    settings = contract.parse({"SCALE": "smoke", "DATASET": dataset, "DATASET_FIELD": field})
    findings = preflight.dataset(settings)
    assert [f.fatal for f in findings] == [True] and "\n" not in findings[0].text, findings
    assert findings[0].text.startswith(f"DATASET={dataset!r}")


def test_good_datasets_pass(tmp_path):
    (tmp_path / "chat.jsonl").write_text(json.dumps(RECORD) + "\n")
    write_parquet(tmp_path / "text.parquet", [{"text": "words"}])
    for name, field in (("chat.jsonl", "messages"), ("text.parquet", "text")):
        settings = contract.parse({"SCALE": "smoke", "DATASET": str(tmp_path / name), "DATASET_FIELD": field})
        assert preflight.dataset(settings) == []


def test_launcher_exits_2_before_torchrun(tmp_path):
    result = launcher(tmp_path, DATASET=str(tmp_path / "missing.jsonl"))
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if "warning:" not in line]
    assert lines == [f"entrypoint: DATASET='{tmp_path / 'missing.jsonl'}' does not exist"], result.stderr
    assert "torch.distributed.run" not in result.stdout  # nothing launched


def test_parquet_footer_names_its_columns(tmp_path):
    from entrypoint import hf_folder

    write_parquet(tmp_path / "a.parquet", [{"text": "x", "context": "y"}])
    assert hf_folder.parquet_columns_named(str(tmp_path / "a.parquet"), "text")
    assert not hf_folder.parquet_columns_named(str(tmp_path / "a.parquet"), "tex")


@pytest.mark.training  # imports torchtitan and datasets: seconds, too slow for make test-fast
def test_loader_follows_the_records(tmp_path, monkeypatch):
    from torchtitan.hf_datasets.text_datasets import ChatDataLoader, HuggingFaceTextDataLoader

    from neuron_qwen3 import data

    text, chat = tmp_path / "text.jsonl", tmp_path / "chat.jsonl"
    text.write_text(json.dumps({"body": "words"}) + "\n")
    chat.write_text(json.dumps(RECORD) + "\n")
    default = HuggingFaceTextDataLoader.Config(dataset="c4")
    assert data.from_env(default, {}) is default
    loader = data.from_env(default, {"DATASET": str(text), "DATASET_FIELD": "body"})
    assert isinstance(loader, HuggingFaceTextDataLoader.Config) and loader.dataset == data.REGISTERED
    assert isinstance(data.from_env(default, {"DATASET": str(chat), "DATASET_FIELD": "messages"}),
                      ChatDataLoader.Config)
    with pytest.raises(ValueError):
        data.local_files(str(tmp_path / "nothing.csv"))


@pytest.mark.training  # imports torchtitan and datasets
def test_sft_masking_counts_exactly_the_assistant_tokens(tmp_path):
    from datasets import load_dataset
    from torchtitan.components.loss import IGNORE_INDEX
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.hf_datasets.text_datasets import ChatDataset

    from neuron_qwen3 import config_registry, data

    (tmp_path / "chat.jsonl").write_text(json.dumps(RECORD) + "\n")
    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(config_registry.SMOKE_TOKENIZER))
    dataset = ChatDataset(load_dataset("json", data_files=str(tmp_path / "chat.jsonl"), split="train"), tokenizer,
                          sample_processor=lambda sample: data.messages(sample, "messages"), seq_len=128)
    inputs, labels = next(iter(dataset))
    counted = labels[labels != IGNORE_INDEX].tolist()
    # by hand: the template closes each turn with `<|im_end|>\n`; ChatDataset strips the trailing newline and
    # ends the record with EOS, so the loss sees the reply, its `<|im_end|>` and EOS, and nothing of the prompt
    reply = tokenizer.encode(ASSISTANT + "<|im_end|>", add_bos=False, add_eos=False)
    assert counted == reply + [tokenizer.eos_id]
    assert tokenizer.decode(counted[:-1]) == ASSISTANT + "<|im_end|>"
    prompt = "<|im_start|>user\nName the capital of France.<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(inputs["input"][: len(tokenizer.encode(prompt, add_bos=False, add_eos=False))].tolist()) \
        == prompt
