"""Packing without leaks, long conversations, the order of epochs and resume, on the bundled smoke tokenizer.

- windows: every conversation is whole in one window, its positions restart at 0 there, its labels are its own
  next tokens (never the next conversation's first), pads are ignored;
- longer than seq_len: truncated at the last turn boundary that keeps a trained token, else split into pieces,
  counted and logged, never dropped;
- the order: a seeded permutation per epoch, the same for every build, different from epoch to epoch, ranks
  disjoint and together the whole data;
- resume: a loader restored from a checkpointed state yields the very windows the first one went on to yield,
  across the end of an epoch.
Run: .venv/bin/python -m pytest tests/test_data_packing.py -q
"""

import json
import logging

import pytest
import torch

pytestmark = pytest.mark.training  # imports torchtitan and datasets

SEQ = 128


def conversation(i, turns=1):
    messages = []
    for t in range(turns):
        messages += [{"role": "user", "content": f"{i} plus {t}?"}, {"role": "assistant", "content": f"{i + t}."}]
    return {"messages": messages, "id": i}


def write(tmp_path, rows, name="chat.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def tokenizer():
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3 import config_registry

    return HuggingFaceTokenizer(tokenizer_path=str(config_registry.SMOKE_TOKENIZER))


def loader(path, field="messages", rank=0, world=1, batch=1, seq_len=SEQ, **config):
    from neuron_qwen3 import data

    return data.DataLoader.Config(source=str(path), field=field, **config).build(
        dp_world_size=world, dp_rank=rank, tokenizer=tokenizer(), seq_len=seq_len, local_batch_size=batch)


def documents(window):
    """(start, end) of each document of a window: where its positions restart."""
    starts = (window["positions"][0] == 0).nonzero().flatten().tolist() + [window["positions"].shape[1]]
    return list(zip(starts, starts[1:]))


def test_conversations_are_whole_and_restart_their_positions(tmp_path):
    from neuron_qwen3.data.tokens import Encoder

    rows = [conversation(i, turns=1 + i % 3) for i in range(12)]
    encoder = Encoder(tokenizer())
    expected = {tuple(encoder.chat(row["messages"]).ids[:-1]) for row in rows}
    assert max(map(len, expected)) <= 2 * SEQ
    seen, pads = set(), 0
    for inputs, labels in loader(write(tmp_path, rows), infinite=False, seq_len=2 * SEQ):
        assert inputs["input"].shape == labels.shape == (1, 2 * SEQ)
        for start, end in documents(inputs):
            ids = tuple(inputs["input"][0, start:end].tolist())
            positions = inputs["positions"][0, start:end].tolist()
            assert positions == list(range(end - start))
            if ids in expected:  # a whole conversation: inputs are its tokens but the last
                seen.add(ids)
            else:  # padding after the last conversation that fit
                assert set(labels[0, start:end].tolist()) == {-100}
                pads += end - start
    assert seen == expected and pads > 0


def test_labels_are_the_documents_own_next_tokens(tmp_path):
    from neuron_qwen3.data.tokens import Encoder

    rows = [conversation(i) for i in range(4)]
    encoder = Encoder(tokenizer(), "all")
    docs = {tuple(d.ids[:-1]): d for d in (encoder.chat(row["messages"]) for row in rows)}
    inputs, labels = next(iter(loader(write(tmp_path, rows), train_on="all")))
    for start, end in documents(inputs)[:-1]:
        doc = docs[tuple(inputs["input"][0, start:end].tolist())]
        assert labels[0, start:end].tolist() == doc.labels  # ends with the conversation's own last token


def test_a_long_conversation_is_truncated_at_a_turn_boundary_or_split(tmp_path, caplog):
    from neuron_qwen3.data.packing import fit
    from neuron_qwen3.data.tokens import Encoder

    encoder = Encoder(tokenizer())
    long_talk = encoder.chat(conversation(7, turns=12)["messages"])
    assert len(long_talk.labels) > SEQ
    (cut,), how = fit(long_talk, SEQ)
    assert how == "truncated" and len(cut.labels) <= SEQ and cut.trained
    assert cut.ids == long_talk.ids[:len(cut.ids)] and cut.labels == long_talk.labels[:len(cut.labels)]
    assert len(cut.ids) in long_talk.turns  # it ends where a turn begins
    monologue = encoder.chat([{"role": "user", "content": "Talk."},
                              {"role": "assistant", "content": " ".join(["words"] * 200)}])
    pieces, how = fit(monologue, SEQ)
    assert how == "split" and len(pieces) >= 2
    assert sum(p.trained for p in pieces) == monologue.trained  # every trained token is still trained once
    assert all(len(p.labels) <= SEQ for p in pieces)
    rows = [conversation(1), conversation(7, turns=12), conversation(2)]
    rows.append({"messages": [{"role": "user", "content": "Talk."},
                              {"role": "assistant", "content": " ".join(["words"] * 200)}]})
    data = loader(write(tmp_path, rows), infinite=False)
    with caplog.at_level(logging.WARNING):
        list(data)
    stats = data.stats()
    assert (stats["records"], stats["truncated"], stats["split"]) == (4, 1, 1)
    assert stats["tokens_cut"] > 0
    assert sum("longer than seq_len 128" in r.getMessage() for r in caplog.records) == 2


def test_every_epoch_is_a_seeded_permutation_dealt_to_the_ranks():
    import numpy as np

    from neuron_qwen3.data.records import Order

    indices = np.arange(100)
    ranks = [Order(indices, 42, rank, 4) for rank in range(4)]
    for epoch in (0, 1):
        shares = [order.epoch(epoch) for order in ranks]
        assert sorted(np.concatenate(shares).tolist()) == list(range(100))
        assert np.array_equal(shares[0], Order(indices, 42, 0, 4).epoch(epoch))  # a restart sees the same
    assert not np.array_equal(ranks[0].epoch(0), ranks[0].epoch(1))
    assert not np.array_equal(ranks[0].epoch(0), Order(indices, 43, 0, 4).epoch(0))


def test_the_reader_reads_each_record_once_an_epoch_in_a_new_order(tmp_path):
    rows = [{"text": f"document number {i}"} for i in range(20)]
    reader = loader(write(tmp_path, rows, "text.jsonl"), field="text", seq_len=16).dataset.reader
    epochs = []
    for _ in range(3):
        epochs.append([reader.next()[0] for _ in range(20)])
        assert reader.next() is None
        reader.next_epoch()
    assert all(sorted(epoch) == list(range(20)) for epoch in epochs)
    assert epochs[0] != epochs[1] != epochs[2]


def test_resume_yields_the_same_windows(tmp_path):
    rows = [conversation(i, turns=1 + i % 4) for i in range(9)]
    path = write(tmp_path, rows)
    first = loader(path, batch=2)
    batches = iter(first)
    for _ in range(3):
        next(batches)
    state = first.state_dict()
    following = [next(batches) for _ in range(6)]  # past the end of the first epoch
    assert first.stats()["epoch"] >= 1
    second = loader(path, batch=2)
    second.load_state_dict(state)
    for (inputs, labels), (again, again_labels) in zip(following, iter(second)):
        assert torch.equal(inputs["input"], again["input"]) and torch.equal(labels, again_labels)
        assert torch.equal(inputs["positions"], again["positions"])


def test_text_fills_every_window(tmp_path):
    """Text flows across windows (no padding but at the end of an epoch); a continued document restarts at 0."""
    rows = [{"text": "The quiet cat reads the river near the lab. " * (1 + i % 5)} for i in range(10)]
    windows = list(loader(write(tmp_path, rows, "text.jsonl"), field="text", seq_len=32, infinite=False))
    for inputs, labels in windows[:-1]:
        assert (labels != -100).all()
        assert inputs["positions"][0, 0] == 0
    assert loader(write(tmp_path, rows, "text.jsonl"), field="text", seq_len=32).stats()["kind"] == "text"
