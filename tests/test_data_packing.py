"""Packing without leaks, long conversations, the order of epochs and resume, on the bundled smoke tokenizer.

- windows: every conversation is whole in one window, its positions restart at 0 there, its labels are its own
  next tokens (never the next conversation's first), pads are ignored;
- longer than seq_len: truncated at the last turn boundary that keeps a trained token, else split into pieces,
  counted and logged, never dropped;
- the order: a seeded permutation per epoch, the same for every build, different from epoch to epoch, ranks
  disjoint and together the whole data;
- resume: a loader restored from a checkpointed state yields the very windows the first one went on to yield,
  across the end of an epoch;
- `real`, the tokens that are not padding (what the MoE router losses count): a conversation that does not fit
  and the epoch's flush leave a pad tail marked False and nothing else; over random pushes, several windows
  buffered at once, the pad is always a window's suffix, a document of its own, and the marks add up to the
  padding count; the marks survive a pickled state_dict/load_state_dict with a pad run still in the buffer (a
  checkpoint from before the marks still loads) and a loader's resume; blank windows (EPOCHS done) are all False;
  the validation Shares hand torchtitan's Validator windows without them.
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
        dp_world_size=world, dp_rank=rank, tokenizer=tokenizer(), seq_len=seq_len, local_batch_size=batch
    )


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
    assert cut.ids == long_talk.ids[: len(cut.ids)] and cut.labels == long_talk.labels[: len(cut.labels)]
    assert len(cut.ids) in long_talk.turns  # it ends where a turn begins
    monologue = encoder.chat(
        [{"role": "user", "content": "Talk."}, {"role": "assistant", "content": " ".join(["words"] * 200)}]
    )
    pieces, how = fit(monologue, SEQ)
    assert how == "split" and len(pieces) >= 2
    assert sum(p.trained for p in pieces) == monologue.trained  # every trained token is still trained once
    assert all(len(p.labels) <= SEQ for p in pieces)
    rows = [conversation(1), conversation(7, turns=12), conversation(2)]
    rows.append(
        {
            "messages": [
                {"role": "user", "content": "Talk."},
                {"role": "assistant", "content": " ".join(["words"] * 200)},
            ]
        }
    )
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
        assert torch.equal(inputs["positions"], again["positions"]) and torch.equal(inputs["real"], again["real"])


def test_text_fills_every_window(tmp_path):
    """Text flows across windows (no padding but at the end of an epoch); a continued document restarts at 0."""
    rows = [{"text": "The quiet cat reads the river near the lab. " * (1 + i % 5)} for i in range(10)]
    windows = list(loader(write(tmp_path, rows, "text.jsonl"), field="text", seq_len=32, infinite=False))
    for inputs, labels in windows[:-1]:
        assert (labels != -100).all()
        assert inputs["positions"][0, 0] == 0
    assert loader(write(tmp_path, rows, "text.jsonl"), field="text", seq_len=32).stats()["kind"] == "text"


# ---- `real`: the tokens that are not padding (what the MoE routers' losses count, moe/routing.py) ---------------

PAD = 0  # the packer's pad id in the tests below; the documents' ids start at 1


def doc(n, start=1):
    """A document of n positions (n + 1 ids), every label counting: a pad is told apart by its IGNORE_INDEX."""
    from neuron_qwen3.data.tokens import Document

    ids = list(range(start, start + n + 1))
    return Document(ids, ids[1:])


def marks(window):
    inputs, labels = window
    return inputs["real"].tolist()


def assert_pad_is_the_suffix(window, seq_len):
    """`real` is True up to the window's pad tail and False over it, exactly where the pad tokens are; the tail is
    a document of its own (its positions restart at 0)."""
    inputs, labels = window
    real = inputs["real"]
    assert real.dtype == torch.bool and real.shape == (seq_len,)
    kept = int(real.sum())
    assert real.tolist() == [True] * kept + [False] * (seq_len - kept)  # no pad before a real token
    pad = (labels == -100) & (inputs["input"] == PAD)
    assert torch.equal(~real, pad)
    if kept < seq_len:
        assert inputs["positions"][kept:].tolist() == list(range(seq_len - kept))
    return seq_len - kept


def test_a_conversation_that_does_not_fit_leaves_a_pad_tail_marked_false_and_so_does_the_epochs_flush():
    from neuron_qwen3.data.packing import Packer

    packer = Packer(8, PAD, whole=True)
    packer.push(doc(5))
    assert packer.pop() is None
    packer.push(doc(4, start=100))  # 5 + 4 > 8: the window is padded, the conversation goes to the next one
    first = packer.pop()
    assert marks(first) == [True] * 5 + [False] * 3
    assert first[1][5:].tolist() == [-100] * 3 and first[0]["input"][5:].tolist() == [PAD] * 3
    assert packer.pop() is None
    last = packer.flush()  # the epoch's end: what is left, padded
    assert marks(last) == [True] * 4 + [False] * 4 and last[0]["input"][:4].tolist() == [100, 101, 102, 103]
    assert packer.flush() is None and packer.padding == 7
    text = Packer(8, PAD, whole=False)  # text flows on: only the epoch's last window has a pad tail
    text.push(doc(5)), text.push(doc(4, start=100))
    assert marks(text.pop()) == [True] * 8 and marks(text.flush()) == [True] + [False] * 7


@pytest.mark.parametrize("whole", [True, False])
def test_the_pad_is_always_a_windows_suffix_and_counts_the_padding(whole):
    """Random documents, pushed several at a time before the windows are taken (so the buffer holds more than one
    window and its pad runs shift as windows leave it), then flushed: every window's pad is its tail, marked
    False, and the marks add up to the packer's padding count."""
    import random

    from neuron_qwen3.data.packing import Packer

    seq_len, draw = 16, random.Random(0)
    packer, padded, windows = Packer(seq_len, PAD, whole), 0, 0
    for _ in range(200):
        for _ in range(draw.randint(1, 3)):
            packer.push(doc(draw.randint(1, seq_len if whole else 3 * seq_len)))  # a whole document fits a window
        while (window := packer.pop()) is not None:
            padded, windows = padded + assert_pad_is_the_suffix(window, seq_len), windows + 1
        if draw.random() < 0.1 and (window := packer.flush()) is not None:
            padded, windows = padded + assert_pad_is_the_suffix(window, seq_len), windows + 1
    if (window := packer.flush()) is not None:
        padded += assert_pad_is_the_suffix(window, seq_len)
    assert padded == packer.padding > 0 and windows > 100 and packer.pad_from == []


def test_the_marks_survive_state_dict_and_load_state_dict_mid_buffer():
    """A buffer holding a full window and, after it, a pad run not yet taken: its state (pickled, as torchtitan
    keeps each rank's loader state) restores the very windows, marks included."""
    import pickle

    from neuron_qwen3.data.packing import Packer

    packer = Packer(8, PAD, whole=True)
    for n in (8, 3, 6):  # [8] [3 + 5 pad] [6]: the pad run is in the buffer's second window
        packer.push(doc(n))
    assert packer.pad_from == [(11, 16)]
    state = pickle.loads(pickle.dumps(packer.state_dict()))
    again = Packer(8, PAD, whole=True)
    again.load_state_dict(state)
    for windows in ([packer.pop(), packer.pop(), packer.flush()], [again.pop(), again.pop(), again.flush()]):
        assert [marks(w) for w in windows] == [[True] * 8, [True] * 3 + [False] * 5, [True] * 6 + [False] * 2]
    assert (packer.pop(), again.pop(), packer.padding, again.padding) == (None, None, 7, 7)
    before = {key: value for key, value in state.items() if key != "pad_from"}  # a checkpoint from before the marks
    old = Packer(8, PAD, whole=True)
    old.load_state_dict(before)  # loads; the pad already in its buffer is not marked, the next pads are
    assert marks(old.pop()) == [True] * 8 and marks(old.pop()) == [True] * 8 and marks(old.flush())[6:] == [False] * 2


def test_the_loaders_windows_mark_their_padding(tmp_path):
    rows = [conversation(i, turns=1 + i % 4) for i in range(9)]
    path = write(tmp_path, rows)
    data = loader(path, infinite=False)
    padding = 0
    for inputs, labels in data:
        real = inputs["real"][0]
        assert inputs["real"].shape == labels.shape and real.dtype == torch.bool
        kept = int(real.sum())
        assert real.tolist() == [True] * kept + [False] * (SEQ - kept)  # the pad is the window's tail
        assert (labels[0, kept:] == -100).all()  # padding never counts in the loss either
        padding += SEQ - kept
    assert padding == data.stats()["tokens_padding"] > 0  # resumed: test_resume_yields_the_same_windows


def test_blank_windows_are_all_padding(tmp_path):
    from neuron_qwen3.data.dataset import blank

    inputs, labels = blank(16, 7)
    assert inputs["real"].dtype == torch.bool and inputs["real"].shape == (16,) and not inputs["real"].any()
    assert (labels == -100).all() and (inputs["input"] == 7).all()
    rows = [{"text": f"document number {i}"} for i in range(4)]  # EPOCHS=1: the epoch's windows, then blanks
    windows = iter(loader(write(tmp_path, rows, "text.jsonl"), field="text", seq_len=32, epochs=1))
    real = [inputs["real"][0] for inputs, _ in (next(windows) for _ in range(8))]
    read = next(i for i, marks in enumerate(real) if not marks.any())  # the epoch's windows
    assert 0 < read <= 4 and all(marks.any() for marks in real[:read]) and not real[read - 1].all()  # flushed
    assert not any(marks.any() for marks in real[read:])


def test_the_validation_shares_pass_no_marks(tmp_path):
    """torchtitan's Validator passes every input but the tokens to the model: the Shares strip `real`, from the
    windows and from the blank ones that even out the ranks."""
    rows = [conversation(i, turns=1 + i % 3) for i in range(6)]
    path = write(tmp_path, rows)
    total = sum(1 for _ in loader(path, split="validation", validation=str(path)))
    assert total >= 1
    mine = list(loader(path, split="validation", validation=str(path), rank=0, world=total + 1))
    blanks = list(loader(path, split="validation", validation=str(path), rank=total, world=total + 1, batch=2))
    assert len(mine) == 1 and len(blanks) == 1  # rank `total` has no window of its own: one batch of 2 blanks
    assert (blanks[0][1] == -100).all() and blanks[0][1].shape == (2, SEQ)
    for inputs, _ in mine + blanks:
        assert sorted(inputs) == ["input", "positions"]
    training, _ = next(iter(loader(path)))
    assert sorted(training) == ["input", "positions", "real"]  # the training loader keeps them
