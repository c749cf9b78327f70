"""VALIDATION through the launcher (smoke scale, CPU): the number is right, the same on 1 and 2 ranks, and shows
over-fitting; it reaches metrics.jsonl, summary.json, loss.png and TensorBoard.

Three launcher runs of the native smoke config, over beside held then two:
  held: INIT_FROM a random Qwen3ForCausalLM saved by transformers, 51 conversations with VALIDATION=0.1 (5 held
        out: a number 2 ranks cannot share evenly), 3 steps, validation every 2 steps (1, 2, and 3 after the
        last), fp32, EXPORT_DTYPE=float32
  two:  INIT_FROM held's export, 2 ranks, learning rate 0, 1 step: the same model, validated on 2 ranks
  over: random init, two short texts trained 30 steps at a high learning rate, VALIDATION = other texts
Run: .venv/bin/python -m pytest tests/test_validation.py -q
"""

import functools
import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from conftest import REPO, side_by_side_env

pytestmark = pytest.mark.training
FP32 = "--training.mixed_precision_param float32"  # FSDP's default bf16 compute would be 1e-3 noise
ZERO_LR = "--tune.lr 0"  # the weights stay: a round trip
GENERATION = Path(__file__).resolve().parent / "data" / "qwen3_style_generation.jinja"  # transformers' mask
RECORDS, SHARE, SEED = 51, "0.1", 42  # 5 held out; 42 is the dataloader's default seed


def conversations(count):
    rows = []
    for i in range(count):
        a, b = i % 10, (3 * i) % 10
        messages = [{"role": "system", "content": "Add."}] if i % 2 else []
        messages += [{"role": "user", "content": f"{a}+{b}?"}, {"role": "assistant", "content": f"{a + b}."}]
        if i % 3 == 0:
            messages += [{"role": "user", "content": f"{b}+{a}?"}, {"role": "assistant", "content": f"{a + b}."}]
        rows.append({"messages": messages})
    return rows


def write_jsonl(path, rows):
    Path(path).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def launch(tmp, name, **env):
    env = side_by_side_env(
        VARIANT="native", SCALE="smoke", OUTPUT_DIR=f"{tmp}/{name}-out", CACHE_DIR=f"{tmp}/cache", **env
    )
    result = subprocess.run(
        [sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return f"{tmp}/{name}-out/report"


@functools.cache
def runs(tmp):
    import transformers

    from neuron_qwen3.config_registry import HF_MODEL, SMOKE_CORPUS

    shape = json.loads((HF_MODEL["smoke"] / "config.json").read_text())
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**shape)).save_pretrained(f"{tmp}/source")
    chat = write_jsonl(f"{tmp}/chat.jsonl", conversations(RECORDS))
    common = dict(DATASET=chat, DATASET_FIELD="messages", VALIDATION=SHARE, EXPORT_DTYPE="float32")

    def held_then_two():
        held = launch(
            tmp,
            "held",
            INIT_FROM=f"{tmp}/source",
            STEPS="3",
            VALIDATION_INTERVAL="2",
            EXPORT_DIR=f"{tmp}/export",
            EXTRA_ARGS=FP32,
            **common,
        )
        extra = f"{FP32} {ZERO_LR}"
        return held, launch(tmp, "two", INIT_FROM=f"{tmp}/export", STEPS="1", NPROC="2", EXTRA_ARGS=extra, **common)

    texts = [json.loads(line)["text"] for line in (SMOKE_CORPUS / "train.jsonl").read_text().splitlines()[:23]]
    over = dict(
        DATASET=write_jsonl(f"{tmp}/tiny.jsonl", [{"text": t[:120]} for t in texts[:2]]),
        VALIDATION=write_jsonl(f"{tmp}/other.jsonl", [{"text": t} for t in texts[20:23]]),
        VALIDATION_INTERVAL="5",
        STEPS="30",
        EXTRA_ARGS="--optimizer.param-groups.0.optimizer-kwargs.lr 3e-3",
    )
    # two at a time: over is independent of held and two (two starts from held's export)
    with ThreadPoolExecutor(2) as pool:
        chained, over = pool.submit(held_then_two), pool.submit(launch, tmp, "over", **over)
        (held, two), over = chained.result(), over.result()
    return {"held": held, "two": two, "over": over, "chat": chat, "export": f"{tmp}/export"}


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    return runs(str(tmp_path_factory.mktemp("validation")))


def metrics(report):
    lines = [json.loads(line) for line in Path(report, "metrics.jsonl").read_text().splitlines()]
    return (
        {r["step"]: r["loss"] for r in lines if "loss" in r},
        {r["step"]: r["validation_loss"] for r in lines if "validation_loss" in r},
    )


def by_hand(folder, chat):
    """The held-out records' mean loss under transformers: the model and tokenizer of `folder` (the export, with
    the tokenizer the run trained with), the mask of transformers' own `return_assistant_tokens_mask` (the
    generation-tagged twin of the template), summed over every trained token and divided by their number."""
    import transformers

    from neuron_qwen3.data import records

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    rows = [json.loads(line) for line in Path(chat).read_text().splitlines()]
    _, held = records.held_out(len(rows), float(SHARE), SEED)
    assert len(held) == 5
    total, count = 0.0, 0
    for i in held.tolist():
        encoded = tokenizer.apply_chat_template(
            rows[i]["messages"],
            chat_template=GENERATION.read_text(),
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        ids = torch.tensor([encoded["input_ids"]])
        mask = torch.tensor(encoded["assistant_masks"][1:], dtype=torch.bool)
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].double()
        losses = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
        total, count = total + losses[mask].sum().item(), count + int(mask.sum())
    return total / count


def test_validation_loss_is_the_exported_models_loss_under_transformers(done):
    _, validations = metrics(done["held"])
    assert sorted(validations) == [1, 2, 3]  # every 2 steps (and step 1, torchtitan's), and after the last
    expected = by_hand(done["export"], done["chat"])
    assert validations[3] == pytest.approx(expected, rel=1e-5), (validations, expected)
    assert validations[1] != pytest.approx(expected, rel=1e-3)  # the training steps moved the model


def test_two_ranks_give_the_number_of_one(done):
    _, one = metrics(done["held"])
    _, two = metrics(done["two"])
    assert sorted(two) == [1]  # 5 held-out records on 2 ranks: uneven shares, no hang
    assert two[1] == pytest.approx(one[3], rel=1e-5), (one, two)


def test_over_fitting_shows(done):
    training, validation = metrics(done["over"])
    assert sorted(validation) == [1, 5, 10, 15, 20, 25, 30]
    best = min(validation, key=validation.get)
    assert 1 < best < 30, validation
    assert training[30] < training[best] < training[1] - 3, training  # training loss falls throughout
    assert validation[best] < validation[1] - 1, validation  # it first generalises, then
    assert validation[30] > validation[best] + 0.1, validation  # validation loss rises as it memorises


def test_summary_and_plot_carry_the_validation_curve(done):
    _, validation = metrics(done["over"])
    summary = json.loads(Path(done["over"], "summary.json").read_text())["validation"]
    best = min(validation, key=validation.get)
    assert summary == {
        "first_loss": validation[1],
        "best_loss": validation[best],
        "best_step": best,
        "last_loss": validation[30],
        "steps": sorted(validation),
    }
    assert Path(done["over"], "loss.png").stat().st_size > 10_000
    assert json.loads(Path(done["held"], "summary.json").read_text())["validation"]["best_step"] == 3


def test_tensorboard_has_the_validation_curve(done):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, validation = metrics(done["over"])
    (events,) = Path(done["over"]).parent.glob("tb/*/events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    logged = {event.step: event.value for event in accumulator.Scalars("validation_metrics/loss")}
    assert sorted(logged) == sorted(validation)
    assert all(math.isclose(logged[step], validation[step], rel_tol=1e-6) for step in logged)
