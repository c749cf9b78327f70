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


def test_a_missing_file_or_an_offline_hub_id_is_one_fatal_line_of_the_launcher(tmp_path):
    for dataset in (str(tmp_path / "missing.jsonl"), "someone/their-data"):
        findings = preflight.dataset(contract.parse({"SCALE": "smoke", "DATASET": dataset}))
        assert [f.fatal for f in findings] == [True] and findings[0].text.startswith(f"DATASET={dataset!r}")
    assert preflight.dataset(contract.parse({"SCALE": "full", "DATASET": "someone/their-data"})) == []


@pytest.mark.parametrize("case", ["empty", "no field", "parquet no field", "three turns"])
def test_records_that_cannot_train_are_one_line_of_the_pre_launch_pass(tmp_path, case):
    from neuron_qwen3 import data

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
    problem = data.scan(str(path), "messages" if case == "three turns" else "text")
    assert problem and "\n" not in problem and problem.startswith(str(path)), problem


def test_good_datasets_pass(tmp_path):
    from neuron_qwen3 import data

    (tmp_path / "chat.jsonl").write_text(json.dumps(RECORD) + "\n")
    write_parquet(tmp_path / "text.parquet", [{"text": "words"}])
    for name, field in (("chat.jsonl", "messages"), ("text.parquet", "text")):
        assert data.scan(str(tmp_path / name), field) is None
        assert preflight.dataset(contract.parse({"SCALE": "smoke", "DATASET": str(tmp_path / name)})) == []


def test_launcher_exits_2_before_torchrun(tmp_path):
    result = launcher(tmp_path, DATASET=str(tmp_path / "missing.jsonl"))
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if "warning:" not in line]
    assert lines == [f"entrypoint: DATASET='{tmp_path / 'missing.jsonl'}' does not exist"], result.stderr
    assert "torch.distributed.run" not in result.stdout  # nothing launched
    (tmp_path / "no-field.jsonl").write_text(json.dumps({"body": "words"}) + "\n")
    result = launcher(tmp_path, DATASET=str(tmp_path / "no-field.jsonl"))
    assert result.returncode == 2 and "torch.distributed.run" not in result.stdout
    assert [line for line in result.stderr.splitlines() if "warning:" not in line] == [
        f"entrypoint: DATASET: {tmp_path / 'no-field.jsonl'}: its first record has no field 'text' (it has: body)"]


@pytest.mark.training  # builds torchtitan's datasets: seconds, too slow for make test-fast
def test_loader_follows_the_records(tmp_path):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.hf_datasets.text_datasets import ChatDataset, HuggingFaceTextDataset

    from neuron_qwen3 import config_registry, data

    text, chat = tmp_path / "text.jsonl", tmp_path / "chat.jsonl"
    text.write_text(json.dumps({"body": "words " * 200}) + "\n")
    chat.write_text(json.dumps(RECORD) + "\n")
    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(config_registry.SMOKE_TOKENIZER))

    def built(source, field):
        return data.DataLoader.Config(source=str(source), field=field).build(
            dp_world_size=1, dp_rank=0, tokenizer=tokenizer, seq_len=16, local_batch_size=1)

    assert isinstance(built(text, "body").dataset, HuggingFaceTextDataset)
    assert isinstance(built(chat, "messages").dataset, ChatDataset)
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
