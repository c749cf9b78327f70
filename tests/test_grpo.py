"""METHOD=grpo through the launcher on CPU: every variant generates, scores and trains; the sampler and the learner
agree; a resumed run draws the same completions.

Runs, two at a time (smoke models from INIT_FROM folders written here, float32, prompt-only "Is N even?" records,
rewards from a module beside the data: `correct` (the answer) and `odd_start` (the first token's parity, which
varies on an untrained model, so the advantages are not all 0)):
  native-lora: LORA_RANK=8, GRPO_BETA=0.04 (the reference: the base, adapters off), GRPO_ITERATIONS=2, 4 steps
  v5:          GRPO_LOSS=grpo, 2 steps
  nki_moe:     NPROC=2, GRPO_BETA=0.04 (INIT_FROM frozen), GRPO_SCALE_REWARDS=batch, GRPO_LOSS=dr_grpo, 2 steps
  whole, resume: native, NPROC=2, GRPO_ITERATIONS=2, 6 steps, a checkpoint at step 3, between the two steps on
               the generation of step 3 (each rank's own); resume runs steps 4 to 6 again from it
  sft, learn, control: a random smoke model first fine-tuned (SFT, 40 steps) to answer "Is N even?" with "Yes." or
               "No." at random; then GRPO, 16 steps of 4 prompts x 8 generations, LR 2e-3, rewarded for "Yes.":
               learn with the reward, control with each group's rewards shuffled (no signal, the same mean); both
               validate on 16 held-out prompts every 8 steps
The loss and gradient against TRL's GRPOTrainer: tests/test_grpo_trl.py. Bad input: tests/test_grpo_inputs.py.
Run: .venv/bin/python -m pytest tests/test_grpo.py -q
"""

import functools
import json
import random
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import REPO, random_smoke_model, rank_logs, side_by_side_env

pytestmark = pytest.mark.training
REWARDS = """
def correct(prompts, completions, answer, **kwargs):
    return [float(c[0]["content"].split("</think>")[-1].strip() == a) for c, a in zip(completions, answer)]


def odd_start(completion_ids, **kwargs):
    return [float(ids[0] % 2) for ids in completion_ids]


def yes(completions, **kwargs):
    return [float(c[0]["content"].split("</think>")[-1].strip() == "Yes.") for c in completions]


def yes_shuffled(completions, **kwargs):
    # yes's rewards shuffled within each group of 8, with a seed drawn from the completions
    import random

    found = yes(completions)
    rng = random.Random(sum(len(c[0]["content"]) for c in completions))
    groups = [found[i : i + 8] for i in range(0, len(found), 8)]
    for group in groups:
        rng.shuffle(group)
    return [reward for group in groups for reward in group]
"""
COMMON = dict(
    METHOD="grpo",
    GRPO_REWARDS="parity_rewards:correct,parity_rewards:odd_start",
    GRPO_GENERATIONS="4",
    GRPO_MAX_COMPLETION="12",
    BATCH_SIZE="8",
    SEQ_LEN="64",  # a prompt and its completion fit in 40 tokens: the rest of the smoke window would be padding
    LR="1e-2",
    WARMUP_STEPS="0",
    EXTRA_ARGS="--training.mixed_precision_param float32",
)


def questions(n: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    return [{"role": "user", "content": f"Is {rng.randrange(10)} even?"} for _ in range(n)]


def launch(tmp, name, **env):
    env = side_by_side_env(SCALE="smoke", OUTPUT_DIR=str(tmp / name), **{**COMMON, **env})
    return subprocess.run(
        [sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
    )


def records(tmp, name) -> list:
    return [json.loads(line) for line in (tmp / name / "report" / "metrics.jsonl").read_text().splitlines()]


@functools.cache
def runs(tmp):
    dense, moe = random_smoke_model(tmp / "dense", 0), random_smoke_model(tmp / "moe", 0, moe=True)
    rng = random.Random(0)
    lines = [
        json.dumps({"prompt": [m], "answer": "Yes." if int(m["content"].split()[1]) % 2 == 0 else "No."}) + "\n"
        for m in questions(400)
    ]
    (tmp / "data").mkdir()
    (tmp / "data" / "parity.jsonl").write_text("".join(lines))
    (tmp / "data" / "parity_rewards.py").write_text(REWARDS)
    data = str(tmp / "data" / "parity.jsonl")
    whole = dict(
        VARIANT="native",
        NPROC="2",
        INIT_FROM=dense,
        DATASET=data,
        STEPS="6",
        GRPO_ITERATIONS="2",
        CHECKPOINT_INTERVAL="3",
    )
    launches = {
        "native-lora": dict(
            VARIANT="native", INIT_FROM=dense, DATASET=data, LORA_RANK="8", GRPO_BETA="0.04", GRPO_ITERATIONS="2"
        ),
        "v5": dict(VARIANT="v5", INIT_FROM=dense, DATASET=data, GRPO_LOSS="grpo", STEPS="2"),
        "nki_moe": dict(
            VARIANT="nki_moe",
            NPROC="2",
            INIT_FROM=moe,
            DATASET=data,
            GRPO_BETA="0.04",
            GRPO_SCALE_REWARDS="batch",
            GRPO_LOSS="dr_grpo",
            STEPS="2",
        ),
    }
    launches["native-lora"]["STEPS"] = "4"

    answers = [{"messages": [m, {"role": "assistant", "content": rng.choice(["Yes.", "No."])}]} for m in questions(400)]
    (tmp / "data" / "sft.jsonl").write_text("".join(json.dumps(record) + "\n" for record in answers))
    held_out = [json.dumps({"prompt": [{"role": "user", "content": f"Is {n} even?"}]}) + "\n" for n in range(10, 26)]
    (tmp / "data" / "held_out.jsonl").write_text("".join(held_out))  # numbers never trained on
    learning = dict(
        VARIANT="native",
        INIT_FROM=str(tmp / "sft-model"),
        DATASET=data,
        VALIDATION=str(tmp / "data" / "held_out.jsonl"),
        VALIDATION_INTERVAL="8",
        GRPO_GENERATIONS="8",
        BATCH_SIZE="32",
        GRPO_MAX_COMPLETION="8",
        STEPS="16",
        LR="2e-3",
    )

    sft = dict(
        DATASET=str(tmp / "data" / "sft.jsonl"),
        DATASET_FIELD="messages",
        STEPS="40",
        LR="3e-3",
        BATCH_SIZE="2",
        SEQ_LEN="256",  # the smoke window: SFT packs several conversations in each
    )

    def after_sft(name, rewards):
        assert tuned.result().returncode == 0, "the SFT run failed: test_runs_finish[sft] says why"
        return launch(tmp, name, **learning, GRPO_REWARDS=rewards)

    def whole_then_resume():
        first = launch(tmp, "whole", **whole, CHECKPOINT_DIR=str(tmp / "whole-checkpoint"))
        shutil.copytree(
            tmp / "whole-checkpoint",
            tmp / "resume-checkpoint",
            ignore=lambda folder, names: [name for name in names if name == "step-6"],
        )
        return first, launch(tmp, "resume", **whole, CHECKPOINT_DIR=str(tmp / "resume-checkpoint"))

    with ThreadPoolExecutor(2) as pool:  # SFT first: learn and control wait for its model
        tuned = pool.submit(
            launch, tmp, "sft", **sft, METHOD="sft", EXPORT_DIR=str(tmp / "sft-model"), EXPORT_DTYPE="float32"
        )
        chained = pool.submit(whole_then_resume)
        learned = {
            "learn": pool.submit(after_sft, "learn", "parity_rewards:yes"),
            "control": pool.submit(after_sft, "control", "parity_rewards:yes_shuffled"),
        }
        done = {name: pool.submit(launch, tmp, name, **env) for name, env in launches.items()}
        done = {name: future.result() for name, future in done.items()}
        done["whole"], done["resume"] = chained.result()
        done["sft"] = tuned.result()
        done.update({name: future.result() for name, future in learned.items()})
    return {"tmp": tmp, "runs": done}


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    return runs(tmp_path_factory.mktemp("grpo"))


@pytest.mark.parametrize("name", ["native-lora", "v5", "nki_moe", "whole", "resume", "sft", "learn", "control"])
def test_runs_finish(done, name):
    result = done["runs"][name]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + rank_logs(done["tmp"] / name)


@pytest.mark.parametrize("name", ["native-lora", "v5", "nki_moe", "whole"])
def test_the_sampler_and_the_learner_agree(done, name):
    """At the first optimizer step on a generation, the training forward's log-probability of every completion
    token equals the one the generator recorded when it drew it, within 1e-5 (float32): the ratio is 1, as
    on-policy GRPO assumes. Every step generates (one iteration) but the odd steps of native-lora and whole (two)."""
    steps = records(done["tmp"], name)
    generated = [r for r in steps if "reward/mean" in r["grpo"]]
    assert [r["step"] for r in generated] == [r["step"] for r in steps][:: 2 if name in ("native-lora", "whole") else 1]
    for r in generated:
        assert 0 <= r["grpo"]["sampling/logp_difference/max"] < 1e-5, r


def test_a_second_iteration_trains_against_the_generators_log_probabilities(done):
    """GRPO_ITERATIONS=2: the step after a generation trains on the same completions (no new rewards), its policy
    moved by the update, so the ratio is off 1 and some tokens are clipped."""
    steps = records(done["tmp"], "native-lora")
    for r in steps[1::2]:
        assert "reward/mean" not in r["grpo"]
        assert r["grpo"]["sampling/logp_difference/mean"] > 1e-3
        assert r["grpo"]["clip_ratio/region_mean"] > 0


def test_the_report_holds_rewards_lengths_timings_and_kl_with_beta(done):
    for name in ("native-lora", "v5", "nki_moe"):
        first = records(done["tmp"], name)[0]["grpo"]
        for reward in ("parity_rewards:correct", "parity_rewards:odd_start"):
            assert 0 <= first[f"rewards/{reward}/mean"] <= 1
        assert 0 < first["completions/mean_length"] <= first["completions/max_length"] <= 12
        assert first["time/generate_s"] > 0 and first["time/train_s"] > 0 and first["entropy"] > 0
        assert ("kl" in first) == (name != "v5")
        summary = json.loads((done["tmp"] / name / "report" / "summary.json").read_text())
        assert summary["grpo"] == records(done["tmp"], name)[-1]["grpo"]
    lora = records(done["tmp"], "native-lora")
    assert lora[0]["grpo"]["kl"] == 0.0  # LoRA's B starts at 0: the policy is the reference
    assert lora[-1]["grpo"]["kl"] > 0


def test_a_resumed_run_draws_the_same_completions(done):
    """Steps 4 to 6 after a resume from step 3's checkpoint: step 4 trains on step 3's generation (two iterations;
    the checkpoint holds it), step 5 draws anew, and the prompts, draws, rewards, lengths and losses are the run's
    that never stopped."""
    whole, resumed = records(done["tmp"], "whole"), records(done["tmp"], "resume")
    assert [r["step"] for r in resumed] == [4, 5, 6]
    for ours, theirs in zip(resumed, whole[3:]):
        assert ("reward/mean" in ours["grpo"]) == ("reward/mean" in theirs["grpo"]) == (ours["step"] == 5)
        for key in ("reward/mean", "rewards/parity_rewards:odd_start/mean", "completions/mean_length"):
            assert ours["grpo"].get(key) == theirs["grpo"].get(key), key
        assert ours["grpo"]["sampling/logp_difference/mean"] == pytest.approx(
            theirs["grpo"]["sampling/logp_difference/mean"], rel=1e-6, abs=1e-9
        )
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-6, abs=1e-9)


def sample_rows(tmp, name) -> list:
    return [json.loads(line) for line in (tmp / name / "report" / "samples.jsonl").read_text().splitlines()]


def test_each_logged_step_shows_a_group_of_training_completions_with_their_rewards(done):
    """At each logged step samples.jsonl (and samples.md) gets the step's first prompt with its 8 sampled
    completions and what the reward gave each; a resumed run writes the same ones as the run that never stopped."""
    data = str(done["tmp"] / "data" / "parity.jsonl")
    rows = [row for row in sample_rows(done["tmp"], "learn") if row["prompt"].startswith(data)]
    assert [r["step"] for r in rows] == [step for step in range(1, 17) for _ in range(8)]
    for step in range(1, 17):
        group = rows[8 * (step - 1) : 8 * step]
        assert len({(r["prompt"], r["text"]) for r in group}) == 1, group  # one prompt, its 8 completions
        for row in group:
            said = row["answer"].split("</think>")[-1].strip()
            assert row["rewards"] == {"parity_rewards:yes": float(said == "Yes."), "total": float(said == "Yes.")}
            assert 0 < len(row["tokens"]) <= 8 and row["stop"] in ("end", "length"), row
    shown = (done["tmp"] / "learn" / "report" / "samples.md").read_text()
    assert f"## {rows[-1]['prompt']}" in shown
    whole, resumed = sample_rows(done["tmp"], "whole"), sample_rows(done["tmp"], "resume")
    assert [r["step"] for r in whole] == [1] * 4 + [3] * 4 + [5] * 4  # GRPO_GENERATIONS=4, two iterations
    assert resumed == whole[8:]


def validations(tmp, name) -> list:
    return [r for r in records(tmp, name) if "validation_loss" in r]


def test_grpo_learns_what_the_reward_asks_and_a_shuffled_reward_does_not(done):
    """From a model that says "Yes." about as often as "No." (SFT on random answers), GRPO rewarded for "Yes." says it
    in over 90 % of its sampled completions over the last 4 of 16 steps, and in over 90 % of its greedy answers to
    held-out prompts (VALIDATION, numbers never trained on) after the last; with each group's rewards shuffled (the
    same rewards, no link to the completions) it gets to neither. The sampled rewards are the learning curve: the
    greedy answer of a model this close to 50/50 tips at the first update, one way or the other."""
    learn, control = ([r for r in records(done["tmp"], name) if "loss" in r] for name in ("learn", "control"))
    assert 0.2 <= learn[0]["grpo"]["reward/mean"] <= 0.8 and control[0]["grpo"]["reward/mean"] <= 0.8
    late = lambda steps: sum(r["grpo"]["reward/mean"] for r in steps[-4:]) / 4  # noqa: E731
    assert late(learn) >= 0.9, [r["grpo"]["reward/mean"] for r in learn]
    assert late(control) < 0.75, [r["grpo"]["reward/mean"] for r in control]
    held, held_control = validations(done["tmp"], "learn"), validations(done["tmp"], "control")
    assert [v["step"] for v in held] == [1, 8, 16]
    assert held[-1]["grpo"]["reward/mean"] >= 0.9, held
    assert held_control[-1]["grpo"]["reward/mean"] < 0.9, held_control


def test_grpo_validation_is_the_held_out_prompts_mean_reward(done):
    """Each validation answers all 16 held-out prompts greedily and scores them with the run's rewards: its loss is
    the mean reward negated, summary.json keeps the best, and samples.md shows 4 of the answers with their
    rewards at each validation."""
    held = validations(done["tmp"], "learn")
    for v in held:
        assert v["validation_loss"] == -v["grpo"]["reward/mean"]
        assert v["grpo"]["rewards/parity_rewards:yes/mean"] * 16 == pytest.approx(round(v["grpo"]["reward/mean"] * 16))
        assert 0 < v["grpo"]["completions/mean_length"] <= 8
    summary = json.loads((done["tmp"] / "learn" / "report" / "summary.json").read_text())["validation"]
    assert summary["best_loss"] == min(v["validation_loss"] for v in held)
    held_out = str(done["tmp"] / "data" / "held_out.jsonl")
    rows = [row for row in sample_rows(done["tmp"], "learn") if row["prompt"].startswith(held_out)]
    assert [r["step"] for r in rows] == [1] * 4 + [8] * 4 + [16] * 4
    for row in rows:
        said = row["answer"].split("</think>")[-1].strip()
        assert row["rewards"] == {"parity_rewards:yes": float(said == "Yes."), "total": float(said == "Yes.")}, row
    shown = (done["tmp"] / "learn" / "report" / "samples.md").read_text()
    assert "| step | stop | answer | rewards |" in shown and "parity_rewards:yes" in shown
