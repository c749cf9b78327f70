"""METHOD=dpo through the launcher on CPU, against TRL's DPOTrainer, and learning a rule from preference pairs.

Runs, two at a time (independent launches, mostly imports on one core):
  native, v5:  INIT_FROM a random Qwen3ForCausalLM, DPO_REFERENCE another (seed 1), 4 pairs, EPOCHS=2 (2 steps
               of the same 4 pairs), LR 1e-3 without warm-up or weight decay, float32
  nki_moe:     the same with Qwen3MoeForCausalLM folders, NPROC=2 (FSDP: the loss is the global batch's mean), and
               the same pairs as VALIDATION; nki_moe-precomputed: the same with DPO_PRECOMPUTE_REF=1
  lora-off, lora-copy: LORA_RANK=8, 3 steps, float32, the reference the base with the adapters off (the default) or
               a frozen copy of INIT_FROM (DPO_REFERENCE=INIT_FROM); lora-precomputed: the first, DPO_PRECOMPUTE_REF=1
  learn:       parity pairs ("Is 4 even?" chosen yes, rejected no; 0-9), 40 steps, LR 3e-3, VALIDATION on a held-out
               file,
               checkpoints every 20 steps, a float32 export
  resume:      the learn run's checkpoint of step 20 alone, run again to step 40
TRL (tests/scenarios/trl_dpo.py) runs on the same folders, pairs and optimizer settings in a fresh interpreter.
Run: .venv/bin/python -m pytest tests/test_dpo.py -q
"""

import functools
import json
import random
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import REPO, random_smoke_model, scenario_json, side_by_side_env
from qwen_size import SMOKE_TOKENIZER

pytestmark = pytest.mark.training
BETA, LR = 0.1, 1e-3
FLOAT32 = "--training.mixed_precision_param float32"
AS_TRL = f"{FLOAT32} --optimizer.param_groups.0.optimizer_kwargs.weight_decay 0"
PAIRS = [  # each fits the nki_moe smoke window (128) alone, two fit the dense one (256)
    (
        [{"role": "system", "content": "Answer with one word."}, {"role": "user", "content": "Say the word: apple"}],
        "apple",
        "river",
    ),
    (
        [
            {"role": "user", "content": "What is 2 + 3?"},
            {"role": "assistant", "content": "5"},
            {"role": "user", "content": "And 4 + 4?"},
        ],
        "8",
        "It is nine.",
    ),
    ([{"role": "user", "content": "Name a colour."}], "Blue, like the sky.", "stone"),
    ([{"role": "user", "content": "Is ice cold?"}], "Yes.", "No, it is warm."),
]


def pair(prompt, chosen, rejected) -> dict:
    return {
        "prompt": prompt,
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
    }


def parity(n: int) -> dict:
    right, wrong = ("yes", "no") if n % 2 == 0 else ("no", "yes")
    return pair([{"role": "user", "content": f"Is {n} even?"}], right, wrong)


def write(path, records) -> str:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(path)


def launch(tmp, name, **env):
    env = side_by_side_env(SCALE="smoke", METHOD="dpo", OUTPUT_DIR=str(tmp / name), **env)
    return subprocess.run(
        [sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
    )


def trl(policy, reference, pairs):
    return scenario_json("trl_dpo", policy, reference, pairs, str(SMOKE_TOKENIZER), str(BETA), str(LR), "sigmoid")


def records(tmp, name) -> list:
    return [json.loads(line) for line in (tmp / name / "report" / "metrics.jsonl").read_text().splitlines()]


@functools.cache
def runs(tmp):
    folders = {
        "dense": random_smoke_model(tmp / "dense", 0),
        "dense-ref": random_smoke_model(tmp / "dense-ref", 1),
        "moe": random_smoke_model(tmp / "moe", 0, moe=True),
        "moe-ref": random_smoke_model(tmp / "moe-ref", 1, moe=True),
    }
    pairs = write(tmp / "pairs.jsonl", [pair(*p) for p in PAIRS])
    rng = random.Random(0)
    train = write(tmp / "parity.jsonl", [parity(rng.randrange(10)) for _ in range(360)])
    held_out = write(tmp / "held-out.jsonl", [parity(rng.randrange(10)) for _ in range(40)])
    as_trl = dict(DATASET=pairs, EPOCHS="2", WARMUP_STEPS="0", LR=str(LR), DPO_BETA=str(BETA), EXTRA_ARGS=AS_TRL)
    lora = dict(
        VARIANT="native",
        INIT_FROM=folders["dense"],
        LORA_RANK="8",
        DATASET=pairs,
        STEPS="3",
        LR="1e-2",
        WARMUP_STEPS="0",
        # float32: the precomputed reference is then the live one bit for bit; in bf16 it differed in its last digits,
        # which the later steps grew to 1e-3 of the loss for some initial adapters (measured)
        EXTRA_ARGS=FLOAT32,
    )
    learn = dict(
        VARIANT="native",
        INIT_FROM=folders["dense"],
        DATASET=train,
        VALIDATION=held_out,
        VALIDATION_INTERVAL="20",
        STEPS="40",
        LR="3e-3",
        WARMUP_STEPS="0",
        CHECKPOINT_INTERVAL="20",
        CHECKPOINT_KEEP="0",
        EXPORT_DTYPE="float32",
    )
    launches = {
        "native": dict(VARIANT="native", INIT_FROM=folders["dense"], DPO_REFERENCE=folders["dense-ref"], **as_trl),
        "v5": dict(VARIANT="v5", INIT_FROM=folders["dense"], DPO_REFERENCE=folders["dense-ref"], **as_trl),
        "nki_moe": dict(
            VARIANT="nki_moe",
            NPROC="2",
            INIT_FROM=folders["moe"],
            DPO_REFERENCE=folders["moe-ref"],
            VALIDATION=pairs,
            **as_trl,
        ),
        "nki_moe-precomputed": dict(
            VARIANT="nki_moe",
            NPROC="2",
            INIT_FROM=folders["moe"],
            DPO_REFERENCE=folders["moe-ref"],
            VALIDATION=pairs,
            DPO_PRECOMPUTE_REF="1",
            **as_trl,
        ),
        "lora-off": lora,
        "lora-precomputed": dict(lora, DPO_PRECOMPUTE_REF="1"),
        "lora-copy": dict(lora, DPO_REFERENCE=folders["dense"], EXPORT_DIR=str(tmp / "lora-export")),
    }

    def learn_then_resume():
        first = launch(
            tmp, "learn", **learn, CHECKPOINT_DIR=str(tmp / "learn-checkpoint"), EXPORT_DIR=str(tmp / "learn-export")
        )
        shutil.copytree(
            tmp / "learn-checkpoint",
            tmp / "resume-checkpoint",
            ignore=lambda folder, names: [name for name in names if name == "step-40"],
        )
        return first, launch(
            tmp, "resume", **learn, CHECKPOINT_DIR=str(tmp / "resume-checkpoint"), EXPORT_DIR=str(tmp / "resume-export")
        )

    with ThreadPoolExecutor(2) as pool:  # the longest job first
        chained = pool.submit(learn_then_resume)
        theirs = {kind: pool.submit(trl, folders[kind], folders[f"{kind}-ref"], pairs) for kind in ("dense", "moe")}
        done = {name: pool.submit(launch, tmp, name, **env) for name, env in launches.items()}
        done = {name: future.result() for name, future in done.items()}
        done["learn"], done["resume"] = chained.result()
        theirs = {kind: future.result() for kind, future in theirs.items()}
    return {"tmp": tmp, "runs": done, "trl": theirs, "held_out": held_out}


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    return runs(tmp_path_factory.mktemp("dpo"))


@pytest.mark.parametrize(
    "name",
    ["native", "v5", "nki_moe", "nki_moe-precomputed", "lora-off", "lora-copy", "lora-precomputed", "learn", "resume"],
)
def test_runs_finish(done, name):
    result = done["runs"][name]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.parametrize("variant", ["native", "v5", "nki_moe"])
def test_step_0_and_one_step_later_are_trls(done, variant):
    """Step 1's metrics are TRL's before any update (the reference differs from the policy, so the loss is not
    ln 2 by construction); step 2 trains the same 4 pairs again, after one AdamW step on both sides. nki_moe's
    loss holds Qwen3-MoE's load-balancing term (INIT_FROM's router_aux_loss_coef, 0.001), as TRL's does."""
    first, second = [r for r in records(done["tmp"], variant) if "loss" in r]  # the training steps' lines
    theirs = done["trl"]["moe" if variant == "nki_moe" else "dense"]
    assert first["dpo"]["pairs"] == second["dpo"]["pairs"] == len(PAIRS)  # every pair in each step
    assert theirs["aux"] == (variant == "nki_moe")
    assert first["loss"] == pytest.approx(theirs["step0"]["loss"], rel=1e-5)
    for name in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "logps/chosen", "logps/rejected"):
        assert first["dpo"][name] == pytest.approx(theirs["step0"][name], rel=1e-5), name
    scale = max(abs(theirs["step0"]["rewards/chosen"]), abs(theirs["step0"]["rewards/rejected"]))
    assert first["dpo"]["rewards/margins"] == pytest.approx(theirs["step0"]["rewards/margins"], abs=1e-5 * scale)
    assert abs(second["loss"] - first["loss"]) > 0.1  # the step moved the policy
    assert second["loss"] == pytest.approx(theirs["step1_loss"], rel=1e-4)


def test_lora_with_the_adapters_off_trains_as_with_a_frozen_copy_of_the_base(done):
    """The adapters-off reference is the base: the same losses, step for step, as a second, frozen copy of
    INIT_FROM's weights; the export is a PEFT adapter folder, as after SFT."""
    off, copy = records(done["tmp"], "lora-off"), records(done["tmp"], "lora-copy")
    assert [r["step"] for r in off] == [r["step"] for r in copy] == [1, 2, 3]
    assert off[0]["dpo"]["rewards/chosen"] == 0.0  # B = 0 at the start: the policy is the base
    assert off[-1]["dpo"]["rewards/margins"] != 0.0  # and then it moved
    for ours, theirs in zip(off, copy):
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-6)
        assert ours["dpo"]["rewards/margins"] == pytest.approx(theirs["dpo"]["rewards/margins"], rel=1e-5, abs=1e-7)
    assert "reference the base model (LoRA adapters off)" in done["runs"]["lora-off"].stdout
    exported = sorted(path.name for path in (done["tmp"] / "lora-export").iterdir())
    assert "adapter_config.json" in exported and "adapter_model.safetensors" in exported


@pytest.mark.parametrize("live,precomputed", [("nki_moe", "nki_moe-precomputed"), ("lora-off", "lora-precomputed")])
def test_a_precomputed_reference_trains_and_validates_as_the_live_one(done, live, precomputed):
    """DPO_PRECOMPUTE_REF=1: the reference's sums of every pair from one pass before the first step (2 ranks, each
    its share; the validation table too), looked up by record: the same losses and held-out metrics."""
    ours, theirs = records(done["tmp"], precomputed), records(done["tmp"], live)
    assert [r["step"] for r in ours] == [r["step"] for r in theirs] and len(ours) >= 3
    for a, b in zip(ours, theirs):
        assert a.get("loss", a.get("validation_loss")) == pytest.approx(
            b.get("loss", b.get("validation_loss")), rel=1e-6
        )
        assert a["dpo"]["rewards/margins"] == pytest.approx(b["dpo"]["rewards/margins"], rel=1e-5, abs=1e-6)
    assert "computed in one pass at the first step" in done["runs"][precomputed].stdout


def test_held_out_pair_accuracy_rises_from_chance_to_90_percent(done):
    validations = [r for r in records(done["tmp"], "learn") if "validation_loss" in r]
    accuracy = {r["step"]: r["dpo"]["rewards/accuracies"] for r in validations}
    assert sorted(accuracy) == [1, 20, 40] and all(r["dpo"]["pairs"] == 40 for r in validations)
    assert accuracy[1] <= 0.75 and accuracy[40] >= 0.9, accuracy
    summary = json.loads((done["tmp"] / "learn" / "report" / "summary.json").read_text())
    assert summary["dpo"]["pairs"] > 0 and (done["tmp"] / "learn" / "report" / "dpo.png").stat().st_size > 0


def test_the_served_export_prefers_the_chosen_answers_of_held_out_pairs(done):
    """In transformers, the export gives the chosen completion of held-out pairs a higher log-probability than
    the rejected one, where INIT_FROM did not."""
    from transformers import AutoModelForCausalLM

    from neuron_qwen3.data import pairs
    from neuron_qwen3.data.tokens import Encoder
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    encoder = Encoder(HuggingFaceTokenizer(tokenizer_path=str(SMOKE_TOKENIZER)))
    held_out = [json.loads(line) for line in open(done["held_out"])]

    def preferred(folder) -> float:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        wins = 0
        for record in held_out:
            sums = []
            for doc in pairs.encode(pairs.pair(record), encoder):
                labels = torch.tensor(doc.labels)
                with torch.no_grad():
                    logps = model(torch.tensor([doc.ids[:-1]])).logits[0].log_softmax(-1)
                counted = labels != -100
                sums.append(logps[counted].gather(-1, labels[counted, None]).sum())
            wins += sums[0] > sums[1]
        return wins / len(held_out)

    assert preferred(str(done["tmp"] / "dense")) <= 0.75
    assert preferred(str(done["tmp"] / "learn-export")) >= 0.9


def test_a_resumed_run_trains_the_same_steps_bit_for_bit(done):
    """The learn run's checkpoint of step 20, resumed: steps 21-40's losses, the held-out metrics at step 40 and
    the export are the uninterrupted run's exactly (the reference is reloaded; nothing of DPO is lost)."""
    from safetensors.torch import load_file

    first = {r["step"]: r for r in records(done["tmp"], "learn") if "loss" in r}  # the training steps' lines
    again = {r["step"]: r for r in records(done["tmp"], "resume") if "loss" in r}
    steps = sorted(again)
    assert steps == list(range(21, 41))
    assert all(again[step]["loss"] == first[step]["loss"] for step in steps)
    assert [r for r in records(done["tmp"], "resume") if "validation_loss" in r][-1]["dpo"] == [
        r for r in records(done["tmp"], "learn") if "validation_loss" in r
    ][-1]["dpo"]
    ours, theirs = (
        load_file(done["tmp"] / "resume-export" / "model.safetensors"),
        load_file(done["tmp"] / "learn-export" / "model.safetensors"),
    )
    assert sorted(ours) == sorted(theirs) and all(torch.equal(ours[key], theirs[key]) for key in ours)
