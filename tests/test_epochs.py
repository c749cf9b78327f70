"""EPOCHS: the steps printed are a count of the packed data, every record is trained on exactly N times (never a
held-out one), and STEPS beside EPOCHS is one line, exit 2. The save on stop in the middle of epoch 2 is in
test_save_on_stop.py.
Run: .venv/bin/python -m pytest tests/test_epochs.py -q
"""

import json
import re
import subprocess
import sys
from collections import Counter

import pytest

from conftest import REPO, recipes_pass, worker_env

pytestmark = pytest.mark.training
EPOCHS, RANKS, SEQ_LEN = 3, 2, 256  # the smoke config's window: several conversations share one
MARK = re.compile(r"ok (\d+)\.")  # in the trained answer: a piece of a split record without one is left out


def conversations(count):
    """Conversations of different lengths, each naming its record in its trained answer."""
    return [
        {
            "messages": [
                {"role": "user", "content": f"item {i}? " + "more " * (i % 7) * 4},
                {"role": "assistant", "content": f"ok {i}."},
            ]
        }
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    path = tmp_path_factory.mktemp("epochs") / "chat.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in conversations(23)))
    return str(path)


def loader_config(chat, **fields):
    from neuron_qwen3 import config_registry
    from neuron_qwen3.data import DataLoader

    config = config_registry.native_qwen3_smoke()
    config.dataloader = DataLoader.Config(source=chat, field="messages", epochs=EPOCHS, **fields)
    config.training.seq_len = SEQ_LEN
    return config


def windows(config, rank, world):
    """Rank `rank`'s windows as its loader yields them, up to the first blank one after the last epoch."""
    from torchtitan.components.loss import IGNORE_INDEX
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3.data import DataLoader

    tokenizer = HuggingFaceTokenizer(tokenizer_path=config.hf_assets_path)
    loader = DataLoader(
        config.dataloader,
        dp_world_size=world,
        dp_rank=rank,
        tokenizer=tokenizer,
        seq_len=config.training.seq_len,
        local_batch_size=config.training.local_batch_size,
    )
    found = []
    for inputs, labels in loader.dataset:
        if loader.dataset.reader.epoch >= EPOCHS and (labels == IGNORE_INDEX).all():
            return tokenizer, found
        found.append((inputs, labels))
    raise AssertionError("the loader ended: EPOCHS pads with blank windows instead")


def test_the_plan_counts_the_packed_windows_of_every_rank(chat):
    from neuron_qwen3.data import epochs

    config = loader_config(chat)
    plan = epochs.plan(config, RANKS)
    counted = [len(windows(config, rank, RANKS)[1]) for rank in range(RANKS)]
    per_rank = config.training.local_batch_size
    assert list(plan.windows) == counted
    assert plan.steps == max(-(-n // per_rank) for n in counted) and plan.sequences == per_rank * RANKS
    assert plan.line == f"{EPOCHS} epochs = {plan.steps} steps of {per_rank * RANKS} sequences"


def test_every_record_is_trained_on_n_times_and_the_held_out_never(chat):
    from neuron_qwen3.data import epochs, records

    config = loader_config(chat, validation="0.2")
    steps = epochs.plan(config, RANKS).steps
    seen = Counter()
    for rank in range(RANKS):
        tokenizer, found = windows(config, rank, RANKS)
        assert len(found) <= steps * config.training.local_batch_size  # all of it within the derived steps
        for inputs, _ in found:
            ids, positions = inputs["input"].tolist(), inputs["positions"].tolist()
            starts = [i for i, p in enumerate(positions) if p == 0] + [len(ids)]
            for start, end in zip(starts, starts[1:]):  # each document of the window
                seen.update(MARK.findall(tokenizer.decode(ids[start:end])))
    train, held = records.held_out(23, 0.2, config.dataloader.seed)
    assert {int(i): n for i, n in seen.items()} == {i: EPOCHS for i in train.tolist()}
    assert not set(held.tolist()) & {int(i) for i in seen}


def test_each_epoch_has_its_own_order(chat):
    config = loader_config(chat)
    config.training.seq_len = 4096  # every record in one window: the order is the window's
    order = [
        MARK.findall(windows(config, 0, 1)[0].decode(inputs["input"].tolist()))
        for inputs, _ in windows(config, 0, 1)[1]
    ]
    assert len(order) == EPOCHS and all(sorted(o) == sorted(order[0]) for o in order)
    assert len({tuple(o) for o in order}) == EPOCHS


def dry_run(**env):
    env = worker_env(VARIANT="native", SCALE="smoke", PATH="/usr/bin:/bin", **env)
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", "--dry-run"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_dry_run_prints_the_steps_the_workers_derive(chat):
    from neuron_qwen3.data import epochs

    result = dry_run(DATASET=chat, DATASET_FIELD="messages", EPOCHS=str(EPOCHS), NPROC=str(RANKS))
    assert result.returncode == 0, result.stderr[-2000:]
    plan = epochs.plan(loader_config(chat), RANKS)
    assert f"epochs: {plan.line}" in json.loads(result.stdout)["notes"]
    shown = json.loads(result.stdout)["torchtitan_config"]["dataloader"]
    assert shown["epochs"] == EPOCHS


def test_a_fine_tunes_warm_up_is_a_fraction_of_the_epochs_steps(chat, tmp_path):
    """INIT_FROM's default warm-up (8 % of the steps, tuning.py) is taken of the steps EPOCHS derives, not of the
    config's: the pre-launch pass and the trainer size both before the schedule."""
    import torch
    from safetensors.torch import save_file

    from neuron_qwen3 import config_registry
    from neuron_qwen3.run import tuning
    from neuron_qwen3.data import epochs

    (tmp_path / "config.json").write_bytes((config_registry.HF_MODEL["smoke"] / "config.json").read_bytes())
    save_file({"w": torch.zeros(8)}, str(tmp_path / "model.safetensors"))
    many = 20  # epochs: enough steps that 8 % of them is not 8 % of the config's ten
    result = dry_run(
        DATASET=chat, DATASET_FIELD="messages", EPOCHS=str(many), NPROC=str(RANKS), INIT_FROM=str(tmp_path)
    )
    assert result.returncode == 0, result.stderr[-2000:]
    config = loader_config(chat)
    config.dataloader.epochs = many
    warmup = tuning.warmup_steps(tuning.FINETUNE_WARMUP, epochs.plan(config, RANKS).steps)
    assert warmup != tuning.warmup_steps(tuning.FINETUNE_WARMUP, config.training.steps)  # else it tells nothing
    shown = json.loads(result.stdout)["torchtitan_config"]
    assert shown["training"]["steps"] == epochs.plan(config, RANKS).steps
    assert shown["lr_scheduler"]["warmup_steps"] == warmup


# The pre-launch pass in process (the launcher prints each problem as its one line and exits 2: the dry runs above
# run the same pass through it).
def test_steps_and_epochs_together_is_one_line(chat, tmp_path):
    answer = recipes_pass(tmp_path, DATASET=chat, DATASET_FIELD="messages", EPOCHS="2", STEPS="5")
    assert answer["problems"] == [
        "STEPS and EPOCHS are both set: EPOCHS derives the steps from the data; give one of them"
    ]


def test_epochs_of_a_streamed_dataset_is_one_line(tmp_path):
    answer = recipes_pass(tmp_path, DATASET="c4", EPOCHS="2", HF_HUB_OFFLINE="1")
    assert answer["problems"] == ["EPOCHS needs a local DATASET; c4 is streamed: give STEPS instead"]


def test_bad_validation_file_is_one_line(chat, tmp_path):
    answer = recipes_pass(tmp_path, DATASET=chat, DATASET_FIELD="messages", VALIDATION=str(tmp_path / "absent.jsonl"))
    assert answer["problems"] == [
        f"VALIDATION='{tmp_path / 'absent.jsonl'}': no such file or folder (nor a fraction like 0.05)"
    ]


def test_fraction_held_out_is_seeded_and_split_by_record():
    from neuron_qwen3.data import records

    train, held = records.held_out(51, 0.1, 42)
    again_train, again_held = records.held_out(51, 0.1, 42)
    assert (train == again_train).all() and (held == again_held).all() and len(held) == 5
    assert sorted(train.tolist() + held.tolist()) == list(range(51))
    assert (records.held_out(51, 0.1, 7)[1] != held).any()
    with pytest.raises(records.DataError, match="leaves none to train on"):
        records.held_out(1, 0.5, 42)
