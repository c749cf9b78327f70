"""DATASET / DATASET_FIELD / TRAIN_ON: the pre-launch checks (one line, exit 2), the flags, the tokenizer chosen,
and what neuron_qwen3.data.DataLoader decides from the records.

The launcher tests stop before torchrun (nothing trains here). Masks: tests/test_data_masks.py; packing and
resume: tests/test_data_packing.py; bad records: tests/test_data_records.py; training: tests/test_finetune_chat.py.
"""

import json
import subprocess
import sys

import pytest

from conftest import REPO, worker_env
from entrypoint import contract, preflight

CHAT = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And Italy?"},
        {"role": "assistant", "content": "Rome."},
    ]
}


def launcher(tmp_path, **env):
    return subprocess.run(
        [sys.executable, "-m", "entrypoint"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=worker_env(SCALE="smoke", OUTPUT_DIR=str(tmp_path / "out"), CACHE_DIR=str(tmp_path / "cache"), **env),
    )


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


def test_a_missing_file_or_an_offline_hub_id_is_one_fatal_line_of_the_launcher(tmp_path):
    for dataset in (str(tmp_path / "missing.jsonl"), "someone/their-data"):
        findings = preflight.dataset(contract.parse({"SCALE": "smoke", "DATASET": dataset}))
        assert [f.fatal for f in findings] == [True] and findings[0].text.startswith(f"DATASET={dataset!r}")
    assert preflight.dataset(contract.parse({"SCALE": "full", "DATASET": "someone/their-data"})) == []


@pytest.mark.parametrize("case", ["empty", "no field", "parquet no field", "no assistant turn"])
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
    elif case == "no assistant turn":
        path.write_text(json.dumps(CHAT) + "\n" + json.dumps({"messages": CHAT["messages"][:2]}) + "\n")
    problem = data.scan(str(path), "messages" if case == "no assistant turn" else "text").problem
    assert problem and "\n" not in problem and problem.startswith(str(path)), problem


def test_good_datasets_pass(tmp_path):
    """Multi-turn chat with a system turn, prompt/completion, parquet text."""
    from neuron_qwen3 import data

    (tmp_path / "chat.jsonl").write_text(json.dumps(CHAT) + "\n")
    (tmp_path / "pc.jsonl").write_text(json.dumps({"prompt": "2+2?", "completion": "4"}) + "\n")
    write_parquet(tmp_path / "text.parquet", [{"text": "words"}])
    for name, field in (("chat.jsonl", "messages"), ("pc.jsonl", "text"), ("text.parquet", "text")):
        assert data.scan(str(tmp_path / name), field).problem is None
        assert preflight.dataset(contract.parse({"SCALE": "smoke", "DATASET": str(tmp_path / name)})) == []


def test_train_on_is_a_flag_of_the_contract():
    assert contract.parse({"TRAIN_ON": "last"}).train_on == "last"
    assert contract.parse({}).train_on == "assistant"
    with pytest.raises(contract.UsageError, match=r"^TRAIN_ON='prompt' is not one of: assistant, last, all"):
        contract.parse({"TRAIN_ON": "prompt"})


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
        f"entrypoint: DATASET: {tmp_path / 'no-field.jsonl'}:1: no field DATASET_FIELD='text' (the record has: body)"
    ]


def build(source, field="text", tokenizer=None, **config):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3 import config_registry, data

    tokenizer = HuggingFaceTokenizer(tokenizer_path=tokenizer or str(config_registry.SMOKE_TOKENIZER))
    return data.DataLoader.Config(source=str(source), field=field, **config).build(
        dp_world_size=1, dp_rank=0, tokenizer=tokenizer, seq_len=128, local_batch_size=1
    )


@pytest.mark.training  # imports torchtitan and datasets: seconds, too slow for make test-fast
def test_the_kind_is_read_from_the_records(tmp_path):
    (tmp_path / "text.jsonl").write_text(json.dumps({"body": "words and words"}) + "\n")
    (tmp_path / "chat.jsonl").write_text(json.dumps(CHAT) + "\n")
    (tmp_path / "sharegpt.json").write_text(
        json.dumps([{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}])
    )
    (tmp_path / "pc.jsonl").write_text(json.dumps({"prompt": "2+2?", "completion": "4"}) + "\n")
    (tmp_path / "lines.txt").write_text("one line\n\nanother line\n")
    write_parquet(tmp_path / "text.parquet", [{"text": "words"}] * 3)
    for name, field, kind, records in (
        ("text.jsonl", "body", "text", 1),
        ("chat.jsonl", "messages", "chat", 1),
        ("sharegpt.json", "conversations", "chat", 1),
        ("pc.jsonl", "text", "chat", 1),
        ("lines.txt", "text", "text", 2),
        ("text.parquet", "text", "text", 3),
    ):
        loader = build(tmp_path / name, field, infinite=False)
        windows = list(loader)
        assert windows and loader.stats()["kind"] == kind and loader.stats()["records"] == records, name


@pytest.mark.training
def test_the_chat_template_is_the_trained_models(tmp_path, qwen_size_tokenizer):
    """INIT_FROM's folder (here one with the real-size tokenizer) renders the data when it has a tokenizer; else
    the trainer's tokenizer (hf_assets_path) does; dataloader.tokenizer_folder, when set, wins."""
    from neuron_qwen3 import config_registry, data

    config = config_registry.native_qwen3_smoke()
    assert data.tokenizer_of(config) == config.hf_assets_path == str(config_registry.SMOKE_TOKENIZER)
    config.checkpoint.initial_load_path, config.checkpoint.initial_load_in_hf = qwen_size_tokenizer, True
    assert data.tokenizer_of(config) == qwen_size_tokenizer
    config.checkpoint.initial_load_path = str(tmp_path)  # a model folder without a tokenizer
    assert data.tokenizer_of(config) == config.hf_assets_path
    config.dataloader.tokenizer_folder = qwen_size_tokenizer
    assert data.tokenizer_of(config) == qwen_size_tokenizer
    (tmp_path / "chat.jsonl").write_text(json.dumps(CHAT) + "\n")
    ours = next(iter(build(tmp_path / "chat.jsonl", "messages", tokenizer_folder=qwen_size_tokenizer)))[0]["input"]
    assert ours[0, 0].item() == 151644  # <|im_start|> of Qwen's vocabulary
    bundled = next(iter(build(tmp_path / "chat.jsonl", "messages", tokenizer_folder=str(tmp_path))))[0]["input"]
    assert bundled.max().item() < 2048
