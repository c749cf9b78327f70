"""DATASET as a mix of local sources with weights (neuron_qwen3/data/mix.py).

- the form: `path:weight,...`; a bad piece, a weight of 0, a missing file, a path given twice: one line each, from
  the launcher's contract and from the recipes; an existing path whose name ends in `:<number>` is one source;
- the order: each epoch holds as many records as the sources together, each source's share by its weight (exactly
  apportioned), seeded and the same on every build, the ranks disjoint; a source drawn less often than it has
  records reads every record over the epochs, one drawn more often repeats each record evenly;
- the loader: 0.7/0.3 over 10k records gives those shares within 1 %, the report's per-source records and tokens
  add up, a resumed loader yields the very windows the first one went on to yield (the per-source counts too),
  a checkpoint of another mix is refused, and the token cache yields the same windows as the files.
Run: .venv/bin/python -m pytest tests/test_data_mix.py -q
"""

import json

import numpy as np
import pytest
import torch

from entrypoint import contract

SEQ = 64


def write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def text_rows(tag, count):
    return [{"text": f"{tag} document {i} " + "word " * (i % 7)} for i in range(count)]


@pytest.fixture
def two(tmp_path):
    """Two text sources: a.jsonl (6,000 records) and b.jsonl (4,000)."""
    return write(tmp_path / "a.jsonl", text_rows("a", 6000)), write(tmp_path / "b.jsonl", text_rows("b", 4000))


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda a, b: f"{a}:0.7,{b}", "has no weight"),
        (lambda a, b: f"{a}:0.7,", "has no weight"),
        (lambda a, b: f"{a}:0,{b}:1", "a weight is a number above 0"),
        (lambda a, b: f"{a}:0.5,{a}:0.5", "is given twice"),
        (lambda a, b: f"{a}:1,/no/such.jsonl:1", "/no/such.jsonl does not exist"),
    ],
)
def test_a_bad_mix_is_one_line_naming_it(two, make, says):
    from neuron_qwen3.data import mix
    from neuron_qwen3.data.records import DataError

    source = make(*two)
    with pytest.raises(DataError) as error:
        mix.parse(source)
    assert says in str(error.value) and repr(source) in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("raw", ["a.jsonl:0.7,b.jsonl", "a.jsonl:0,b.jsonl:1", "a.jsonl:0.7,", "a:1,,b:1"])
def test_the_launcher_refuses_a_mix_of_another_form_in_one_line(raw):
    var = next(var for var in contract.VARS if var.name == "DATASET")
    with pytest.raises(contract.UsageError) as error:
        contract.parse({"DATASET": raw})
    assert str(error.value) == f"DATASET={raw!r} is not {var.allowed}"


def test_one_source_is_no_mix(tmp_path):
    from neuron_qwen3.data import mix

    odd = write(tmp_path / "notes:2", text_rows("n", 3))  # an existing path is one source, whatever its name
    assert mix.parse(odd) is None and mix.parse("allenai/c4") is None and mix.parse("c4") is None
    assert mix.local_paths(odd) == [odd] and mix.local_paths("c4") is None
    assert contract.parse({"DATASET": odd}).dataset == odd


@pytest.mark.parametrize("total, weights", [(10, [0.7, 0.3]), (7, [1, 1, 1]), (10_001, [3, 2, 0.5]), (1, [1, 9])])
def test_shares_sum_exactly_and_follow_the_weights(total, weights):
    from neuron_qwen3.data import mix

    counts = mix.shares(total, weights)
    assert counts.sum() == total
    assert np.all(np.abs(counts - np.asarray(weights) / sum(weights) * total) < 1)


def orders(ends, weights, world=1, seed=7, indices=None):
    from neuron_qwen3.data import mix

    sources = mix.Sources(tuple(f"s{k}" for k in range(len(ends))), tuple(weights), tuple(ends))
    indices = np.arange(ends[-1]) if indices is None else indices
    return [mix.Order(indices, sources, seed, rank, world) for rank in range(world)]


def test_an_epoch_draws_each_sources_share_seeded_and_dealt_to_the_ranks():
    ends = (6000, 10_000)
    one = orders(ends, (0.7, 0.3))[0]
    epoch = one.epoch(0)
    assert len(epoch) == 10_000 and (epoch < 6000).sum() == 7000 and (epoch >= 6000).sum() == 3000
    assert np.array_equal(epoch, orders(ends, (0.7, 0.3))[0].epoch(0))  # seeded: every build, every restart
    assert not np.array_equal(epoch, one.epoch(1))
    assert not np.array_equal(epoch, orders(ends, (0.7, 0.3), seed=8)[0].epoch(0))
    ranks = [order.epoch(0) for order in orders(ends, (0.7, 0.3), world=3)]
    assert np.array_equal(np.sort(np.concatenate(ranks)), np.sort(epoch))  # the same epoch, dealt out


def test_every_record_is_read_over_the_epochs_and_repeats_are_even():
    ends = (6000, 10_000)
    one = orders(ends, (0.7, 0.3))[0]
    epochs = [one.epoch(e) for e in range(4)]  # b: 3,000 an epoch of 4,000; a: 7,000 of 6,000
    b = np.concatenate([e[e >= 6000] for e in epochs])
    assert set(b[:6000].tolist()) | set(b[6000:].tolist()) == set(range(6000, 10_000))
    assert np.bincount(b - 6000).max() - np.bincount(b - 6000, minlength=4000).min() <= 1  # 12,000 reads of 4,000
    a = np.bincount(np.concatenate([e[e < 6000] for e in epochs]), minlength=6000)
    assert a.min() >= 4 and a.max() <= 5  # 28,000 reads of 6,000: each 4 or 5 times


def test_validation_held_out_records_are_never_drawn():
    held = np.arange(0, 10_000, 10)
    kept = np.setdiff1d(np.arange(10_000), held)
    epoch = orders((6000, 10_000), (0.5, 0.5), indices=kept)[0].epoch(0)
    assert len(epoch) == len(kept) and not np.isin(epoch, held).any()


def loader(source, rank=0, world=1, batch=4, **config):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3 import config_registry, data

    return data.DataLoader.Config(source=source, field="text", **config).build(
        dp_world_size=world,
        dp_rank=rank,
        seq_len=SEQ,
        local_batch_size=batch,
        tokenizer=HuggingFaceTokenizer(tokenizer_path=str(config_registry.SMOKE_TOKENIZER)),
    )


@pytest.mark.training  # torchtitan's dataloader and the tokenizer
def test_a_mixs_epoch_gives_the_weights_shares_and_counts_them_by_source(two):
    a, b = two
    mixed = loader(f"{a}:0.7,{b}:0.3", infinite=False)
    windows = sum(1 for _ in mixed.dataset)
    stats = mixed.stats()
    records = {path: s["records"] for path, s in stats["sources"].items()}
    assert sum(records.values()) == stats["records"] == 10_000 and windows > 0
    assert abs(records[a] / 10_000 - 0.7) < 0.01 and abs(records[b] / 10_000 - 0.3) < 0.01
    assert sum(s["tokens_trained"] for s in stats["sources"].values()) == stats["tokens_trained"]


@pytest.mark.training
def test_a_resumed_mix_yields_the_same_windows_and_counts(two):
    a, b = two
    source = f"{a}:2,{b}:1"
    first = loader(source)
    batches = iter(first)
    for _ in range(40):
        next(batches)
    state = first.state_dict()
    following = [next(batches) for _ in range(20)]
    second = loader(source)
    second.load_state_dict(state)
    again = iter(second)
    for inputs, labels in following:
        more, more_labels = next(again)
        assert torch.equal(inputs["input"], more["input"]) and torch.equal(labels, more_labels)
        assert torch.equal(inputs["positions"], more["positions"])
    assert first.stats()["sources"] == second.stats()["sources"]

    other = loader(f"{a}:1,{b}:1")
    other.load_state_dict(state)  # read when the iteration starts
    with pytest.raises(Exception, match="resume on the same mix"):
        next(iter(other))


@pytest.mark.training
def test_a_cached_mix_yields_the_files_windows(tmp_path):
    """Sources under cache.SERIAL records: the caches are built in this process (a spawned builder's imports
    would take most of the test)."""
    a, b = write(tmp_path / "a.jsonl", text_rows("a", 600)), write(tmp_path / "b.jsonl", text_rows("b", 400))
    source = f"{a}:0.25,{b}:0.75"
    files = [(i["input"].tolist(), l.tolist()) for i, l in loader(source, infinite=False)]
    cached = loader(source, infinite=False, cache_dir=str(tmp_path / "cache"))
    assert [(i["input"].tolist(), l.tolist()) for i, l in cached] == files
    stats = cached.stats()
    assert stats["cache"]["hit"] is False and len(stats["cache"]["folder"]) == 2
    hit = loader(source, infinite=False, cache_dir=str(tmp_path / "cache"))
    assert [(i["input"].tolist(), l.tolist()) for i, l in hit] == files and hit.stats()["cache"]["hit"] is True


def test_the_launcher_passes_a_mixs_paths_absolute_and_checks_they_exist(two, tmp_path, monkeypatch):
    from entrypoint import plan, preflight
    from test_entrypoint_plan import DEVICES, after

    monkeypatch.chdir(tmp_path)
    environ = {"SCALE": "smoke", "DATASET": "a.jsonl:0.7,b.jsonl:0.3"}
    built = plan.build(contract.parse(environ), DEVICES["cpu"], environ)
    assert after(built.worker_args, "--dataloader.source") == f"{two[0]}:0.7,{two[1]}:0.3"
    assert preflight.dataset(contract.parse(environ)) == []
    missing = preflight.dataset(contract.parse({"SCALE": "smoke", "DATASET": "a.jsonl:1,gone.jsonl:1"}))
    assert len(missing) == 1 and "gone.jsonl does not exist" in str(missing[0])
