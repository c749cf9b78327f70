"""The token cache (neuron_qwen3/data/cache.py): what a cached set yields is what the tokenizer yields, a hit
reads and tokenizes nothing, a cache cut short is rebuilt, the key follows the data, tokenizer, template and
TRAIN_ON, a bad record fails the build and leaves nothing, and the build runs on several processes.

The unit tests build small sets in this process; those marked `training` spawn the build's processes or launch
smoke runs (cached against uncached: the same losses, the same EPOCHS steps).
Run: .venv/bin/python -m pytest tests/test_token_cache.py -q
"""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, beside, rank_logs, worker_env

SEQ = 128


def conversation(i):
    """Of different shapes: a system turn, several turns, reasoning, tool calls, some longer than SEQ."""
    messages = [{"role": "system", "content": "Be brief."}] if i % 2 else []
    for t in range(1 + i % 3):
        messages += [
            {"role": "user", "content": f"{i} plus {t}? " + "more " * (i % 5) * 12},
            {"role": "assistant", "content": f"{i + t}.", **({"reasoning_content": "add"} if t else {})},
        ]
    if i % 4 == 3:
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": {"q": str(i)}}}],
            },
            {"role": "tool", "content": "found"},
            {"role": "assistant", "content": "done."},
        ]
    return {"messages": messages}


def write(path, rows):
    Path(path).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.fixture
def chat(tmp_path):
    return write(tmp_path / "chat.jsonl", [conversation(i) for i in range(30)])


def smoke_tokenizer():
    from neuron_qwen3 import config_registry

    return str(config_registry.SMOKE_TOKENIZER)


def prepare(cache_dir, source, field="messages", train_on="assistant", folder=None, **kwargs):
    from neuron_qwen3.data import cache

    return cache.prepare(str(cache_dir), str(source), field, train_on, folder or smoke_tokenizer(), **kwargs)


def key(cache_dir, source, field="messages", train_on="assistant", folder=None):
    from neuron_qwen3.data import cache

    return cache.key(str(cache_dir), str(source), field, train_on, folder or smoke_tokenizer())


def tokenized(source, kind, field="messages", train_on="assistant"):
    """Every record's Document as the dataset tokenizes it without a cache."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3.data import dataset, records
    from neuron_qwen3.data.tokens import Encoder

    table = records.local_table(str(source))
    encoder = Encoder(HuggingFaceTokenizer(tokenizer_path=smoke_tokenizer()), train_on)
    return [dataset.tokenize(table.record(i), kind, field, encoder) for i in range(len(table))]


def windows(source, cache_dir="", field="messages", **config):
    """(every window of one pass, the loader's stats) of a one-rank loader."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3 import data

    loader = data.DataLoader.Config(
        source=str(source), field=field, cache_dir=str(cache_dir), infinite=False, **config
    ).build(
        dp_world_size=1,
        dp_rank=0,
        seq_len=SEQ,
        local_batch_size=1,
        tokenizer=HuggingFaceTokenizer(tokenizer_path=smoke_tokenizer()),
    )
    return [
        (inputs["input"].tolist(), inputs["positions"].tolist(), labels.tolist()) for inputs, labels in loader.dataset
    ], loader.stats()


def refuse_tokenizing(monkeypatch):
    """Any record read, rendered or tokenized from here on fails the test."""
    from neuron_qwen3.data import records, tokens

    def refused(*args, **kwargs):
        raise AssertionError("a cached set was read or tokenized")

    for cls, name in ((tokens.Encoder, "chat"), (tokens.Encoder, "text"), (records.JsonLines, "record")):
        monkeypatch.setattr(cls, name, refused)


@pytest.mark.parametrize("train_on", ["assistant", "last", "all"])
def test_a_cached_document_is_the_encoders(tmp_path, chat, train_on):
    cached = prepare(tmp_path / "cache", chat, train_on=train_on)
    assert cached.kind == "chat" and len(cached) == 30 and not cached.hit
    assert [cached.document(i) for i in range(30)] == tokenized(chat, "chat", train_on=train_on)
    assert (cached.labels == [len(doc.labels) for doc in tokenized(chat, "chat", train_on=train_on)]).all()


def test_text_is_cached_too(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("".join(f"line {i} " + "word " * i + "\n" for i in range(20)))
    cached = prepare(tmp_path / "cache", text, field="text")
    assert cached.kind == "text" and [cached.document(i) for i in range(20)] == tokenized(text, "text", "text")


def test_a_hit_reads_and_tokenizes_nothing_and_yields_the_same_windows(tmp_path, chat, monkeypatch):
    from neuron_qwen3.data import tokens

    uncached, stats = windows(chat)
    assert stats["cache"] is None
    calls = []
    chat_call = tokens.Encoder.chat
    monkeypatch.setattr(tokens.Encoder, "chat", lambda self, *args: calls.append(1) or chat_call(self, *args))
    built, stats = windows(chat, tmp_path / "cache")
    assert built == uncached and len(calls) == 30
    assert stats["cache"]["hit"] is False and stats["cache"]["prepare_s"] > 0
    refuse_tokenizing(monkeypatch)
    hit, stats = windows(chat, tmp_path / "cache")
    assert hit == uncached and stats["records"] == 30 and stats["truncated"] + stats["split"] > 0
    assert stats["cache"]["hit"] is True and Path(stats["cache"]["folder"]).parent == tmp_path / "cache"


def test_validation_reads_the_same_cache(tmp_path, chat, monkeypatch):
    uncached = windows(chat, validation="0.2", split="validation")[0]
    windows(chat, tmp_path / "cache")  # built by the training loader
    refuse_tokenizing(monkeypatch)
    held, stats = windows(chat, tmp_path / "cache", validation="0.2", split="validation")
    assert held == uncached and stats["cache"]["hit"]


def test_the_epochs_plan_from_the_cache_is_the_tokenizers(tmp_path, chat, monkeypatch):
    from neuron_qwen3 import config_registry
    from neuron_qwen3.data import DataLoader, epochs

    def config(cache_dir):
        config = config_registry.native_qwen3_smoke()
        config.dataloader = DataLoader.Config(
            source=chat, field="messages", epochs=3, cache_dir=str(cache_dir), validation="0.1"
        )
        config.training.seq_len = SEQ
        return config

    uncached = epochs.plan(config(""), 2)
    assert epochs.plan(config(tmp_path / "cache"), 2) == uncached  # built
    refuse_tokenizing(monkeypatch)
    assert epochs.plan(config(tmp_path / "cache"), 2) == uncached  # hit: lengths, and the long ones fit


def test_a_cache_cut_short_is_rebuilt_and_a_dead_writers_folder_removed(tmp_path, chat):
    from neuron_qwen3.data import cache

    folder = tmp_path / "cache"
    first = prepare(folder, chat)
    expected = [first.document(i) for i in range(30)]
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = Path(first.folder).name
    removed = {
        f"{name}.tmp-{cache.HOST}-{dead.pid}": True,  # a killed writer's, on this host
        f"{name}.tmp-{cache.HOST}-{os.getppid()}": False,  # a live one's
        f"{name}.tmp-elsewhere-1": False,  # another host's, recent
        "other.tmp-elsewhere-2": True,
    }  # another host's, a day old
    for tmp in removed:
        shutil.copytree(first.folder, folder / tmp)
        (folder / tmp / cache.DONE).unlink()  # cut short: no marker
    os.utime(folder / "other.tmp-elsewhere-2", (time.time() - 2 * cache.STALE_S,) * 2)
    for cut in ("missing", "truncated", "no marker"):
        target = Path(first.folder)
        if cut == "missing":
            (target / "ids-0.npy").unlink()
        elif cut == "truncated":
            data = (target / "mask-0.npy").read_bytes()
            (target / "mask-0.npy").write_bytes(data[:-7])
        else:
            (target / cache.DONE).unlink()
        again = prepare(folder, chat)
        assert not again.hit and [again.document(i) for i in range(30)] == expected, cut
    assert prepare(folder, chat).hit
    assert {tmp: not (folder / tmp).exists() for tmp in removed} == removed


def test_a_lost_rename_discards_its_own_copy(tmp_path, chat):
    from neuron_qwen3.data import cache

    first = prepare(tmp_path / "cache", chat)
    cache.build(first.folder, chat, "messages", "assistant", smoke_tokenizer())  # as if its lock had not held
    assert sorted(os.listdir(tmp_path / "cache")) == sorted(
        [Path(first.folder).name, Path(first.folder).name + ".lock", "hashes.json", "hashes.json.lock"]
    )
    assert prepare(tmp_path / "cache", chat).hit


def test_builders_at_once_build_once(tmp_path, chat):
    found = []
    threads = [threading.Thread(target=lambda: found.append(prepare(tmp_path / "cache", chat))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(tokens.hit for tokens in found) == [False, True, True]
    assert len({tokens.folder for tokens in found}) == 1


def test_the_key_follows_the_content(tmp_path, chat):
    rows = [conversation(i) for i in range(30)]
    base = key(tmp_path / "cache", chat)
    assert key(tmp_path / "cache", write(tmp_path / "copy.jsonl", rows)) == base  # the bytes, not the path
    rows[17]["messages"][-1]["content"] += "!"
    assert key(tmp_path / "cache", write(tmp_path / "changed.jsonl", rows)) != base
    assert key(tmp_path / "cache", chat, train_on="last") != base
    assert key(tmp_path / "cache", chat, field="conversations") != base
    template = shutil.copytree(smoke_tokenizer(), tmp_path / "tokenizer")
    assert key(tmp_path / "cache", chat, folder=str(template)) == base
    with open(template / "chat_template.jinja", "a") as f:
        f.write("{#- another template #}")
    assert key(tmp_path / "cache", chat, folder=str(template)) != base
    config = json.loads((template / "tokenizer_config.json").read_text())
    shutil.copy(Path(smoke_tokenizer()) / "chat_template.jinja", template / "chat_template.jinja")
    (template / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|im_end|>"}))
    assert key(tmp_path / "cache", chat, folder=str(template)) != base


def test_a_files_hash_is_read_again_only_when_it_changed(tmp_path, chat, monkeypatch):
    import hashlib

    read = []
    digest = hashlib.file_digest
    monkeypatch.setattr(hashlib, "file_digest", lambda f, name: read.append(f.name) or digest(f, name))
    key(tmp_path / "cache", chat)
    assert read and chat in read
    read.clear()
    key(tmp_path / "cache", chat)
    assert read == []
    stat = os.stat(chat)
    os.utime(chat, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1000))
    key(tmp_path / "cache", chat)
    assert read == [chat]


@pytest.mark.parametrize("bad", ["json", "conversation"])
def test_a_bad_record_fails_the_build_with_its_line_and_keeps_nothing(tmp_path, bad):
    from neuron_qwen3.data import DataError, scan

    rows = [json.dumps(conversation(i)) for i in range(12)]
    rows[4] = "{not json" if bad == "json" else json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    rows[9] = "{also not json"
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(DataError) as error:
        prepare(tmp_path / "cache", path)
    assert str(error.value) == scan(str(path), "messages", tokenizer_folder=smoke_tokenizer()).problem
    assert str(error.value).startswith(f"{path}:5: ")
    assert sorted(name for name in os.listdir(tmp_path / "cache") if not name.endswith((".lock", ".json"))) == []


def test_the_launcher_gives_the_workers_the_cache_folder(tmp_path):
    from entrypoint import contract, plan
    from entrypoint.discovery import Devices

    def args(**environ):
        environ = {"SCALE": "smoke", "CACHE_DIR": str(tmp_path / "c"), **environ}
        return plan.build(contract.parse(environ), Devices("cpu", 2), environ).worker_args

    assert f"--dataloader.cache_dir={tmp_path / 'c' / 'tokens'}" in args(DATASET=str(tmp_path))
    assert not [arg for arg in args() if arg.startswith("--dataloader")]  # the bundled corpus: the config's own


# ---- the build's processes, and smoke runs through the launcher


@pytest.mark.training
def test_the_build_runs_on_several_processes(tmp_path):
    """3,200 records, about 10 s of one core: far more than the spawned processes' import times can differ by on a
    loaded machine, so both take chunks (with 400, the first one ready sometimes took them all)."""
    from neuron_qwen3.data import cache

    source = write(tmp_path / "many.jsonl", [conversation(i) for i in range(3200)])
    final = os.path.join(tmp_path / "cache", key(tmp_path / "cache", source))
    cache.build(final, source, "messages", "assistant", smoke_tokenizer(), processes=2, chunk=64)
    cached = prepare(tmp_path / "cache", source)
    assert cached.hit and len(cached.writers) == 2 and os.getpid() not in cached.writers
    assert len([name for name in os.listdir(final) if name.startswith("ids-")]) == 50
    assert [cached.document(i) for i in range(3200)] == tokenized(source, "chat")


@pytest.mark.training
def test_a_bad_record_fails_a_parallel_build_with_the_first_line(tmp_path):
    from neuron_qwen3.data import DataError, cache

    rows = [json.dumps(conversation(i)) for i in range(60)]
    rows[37], rows[13] = "{late", json.dumps({"messages": "not a list"})
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(rows) + "\n")
    final = os.path.join(tmp_path / "cache", key(tmp_path / "cache", path))
    with pytest.raises(DataError, match=f"^{path}:14: "):
        cache.build(final, str(path), "messages", "assistant", smoke_tokenizer(), processes=2, chunk=4)
    assert [name for name in os.listdir(tmp_path / "cache") if not name.endswith((".lock", ".json"))] == []


def launch(tmp, name, **env):
    out = tmp / f"{name}-out"
    env = worker_env(VARIANT="native", SCALE="smoke", OUTPUT_DIR=str(out), CACHE_DIR=str(tmp / "cache"), **env)
    result = subprocess.run(
        [sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + rank_logs(out)
    lines = [json.loads(line) for line in (out / "report" / "metrics.jsonl").read_text().splitlines()]
    logs = "".join(path.read_text() for path in sorted((out / "torchrun").rglob("stdout.log")))
    summary = json.loads((out / "report" / "summary.json").read_text())
    return {r["step"]: r["loss"] for r in lines if "loss" in r}, logs, summary


@pytest.mark.training
def test_cached_and_uncached_runs_train_the_same_losses_in_the_same_steps(tmp_path):
    """EPOCHS=1 on 2 ranks over a mix of two sources (data/mix.py): the pre-launch pass builds each source's cache,
    both workers find them (and tokenize nothing); the run without it (`--dataloader.cache_dir=`) takes the same
    steps to bitwise the same losses. summary.json's `data` says the cache was hit, and what each source gave."""
    a = write(tmp_path / "a.jsonl", [conversation(i) for i in range(24)])
    b = write(tmp_path / "b.jsonl", [conversation(100 + i) for i in range(16)])
    common = dict(DATASET=f"{a}:0.6,{b}:0.4", DATASET_FIELD="messages", EPOCHS="1", NPROC="2")
    (cached, logs, summary), (uncached, _, plain) = beside(  # the run without the cache never reads or writes it
        lambda: launch(tmp_path, "cached", **common),
        lambda: launch(tmp_path, "uncached", EXTRA_ARGS="--dataloader.cache_dir=", **common),
    )
    assert len(cached) > 1 and cached == uncached
    assert len(re.findall(r"data: token cache \S+: found\n", logs)) == 8  # each source's: the plan, the loader; 2 ranks
    assert len([path for path in (tmp_path / "cache" / "tokens").iterdir() if path.is_dir()]) == 2  # a key each
    data = summary["data"]
    assert data["cache"]["hit"] is True and data["cache"]["built_s"] > 0 and len(data["cache"]["folder"]) == 2
    assert (
        {path: s["records"] for path, s in data["sources"].items()}
        == {a: 24, b: 16}
        == {path: s["records"] for path, s in plain["data"]["sources"].items()}
    )
    assert sum(s["tokens_trained"] for s in data["sources"].values()) == data["tokens_trained"] > 0
    assert "cache" not in plain["data"] and data["tokens_trained"] == plain["data"]["tokens_trained"]


@pytest.mark.training
def test_without_epochs_the_first_rank_builds_on_every_core_and_the_other_waits(tmp_path):
    """2,100 records: 3 chunks, so the rank that takes the lock first builds on 2 spawned processes inside its
    torchrun worker, while the other waits on the lock and then opens the cache."""
    chat = write(tmp_path / "chat.jsonl", [conversation(i % 8) for i in range(2100)])
    _, logs, _ = launch(tmp_path, "run", DATASET=chat, DATASET_FIELD="messages", STEPS="2", NPROC="2")
    assert len(re.findall(r"data: token cache \S+: built in \S+ s on 2 processes\n", logs)) == 1
    assert len(re.findall(r"data: token cache \S+: found\n", logs)) == 1
