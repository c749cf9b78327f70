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
  sft, learn, control: a random smoke model first fine-tuned (SFT, 40 steps) to answer prompts such as "Case 137:
               answer No." with "Yes." or "No." at random; then GRPO, LEARN_STEPS steps of 16 prompts x 4
               generations, LR 5e-4, rewarded for the answer the prompt states (`correct`): learn with the reward,
               control with each group's rewards shuffled (no signal, the same mean); both validate on 16 held-out
               prompts four times
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



def correct_shuffled(prompts, completions, answer, **kwargs):
    # correct's rewards shuffled within each group of 4, with a seed drawn from the completions
    import random

    found = correct(prompts, completions, answer)
    rng = random.Random(sum(len(c[0]["content"]) for c in completions))
    groups = [found[i : i + 4] for i in range(0, len(found), 4)]
    for group in groups:
        rng.shuffle(group)
    return [reward for group in groups for reward in group]
"""
LEARN_STEPS = 64  # GRPO's steps from the SFT model: 16 prompts x 4 generations each
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


def instructed(number: int, answer: str) -> dict:
    """A prompt that says its answer among filler ("Case 137: answer No."): a policy is right only if it reads the
    prompt, and held-out prompts carry numbers never trained on."""
    return {"prompt": [{"role": "user", "content": f"Case {number}: answer {answer}"}], "answer": answer}


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

    said = lambda: rng.choice(["Yes.", "No."])  # noqa: E731
    cases = [instructed(rng.randrange(100, 500), said()) for _ in range(800)]
    (tmp / "data" / "cases.jsonl").write_text("".join(json.dumps(record) + "\n" for record in cases))
    answers = [
        {
            "messages": [
                instructed(rng.randrange(100, 500), said())["prompt"][0],
                {"role": "assistant", "content": said()},
            ]
        }
        for _ in range(400)
    ]
    (tmp / "data" / "sft.jsonl").write_text("".join(json.dumps(record) + "\n" for record in answers))
    held_out = [json.dumps(instructed(n, ["Yes.", "No."][n % 2])) + "\n" for n in range(500, 516)]
    (tmp / "data" / "held_out.jsonl").write_text("".join(held_out))  # numbers never trained on, half of each answer
    learning = dict(
        VARIANT="native",
        INIT_FROM=str(tmp / "sft-model"),
        DATASET=str(tmp / "data" / "cases.jsonl"),
        VALIDATION=str(tmp / "data" / "held_out.jsonl"),
        VALIDATION_INTERVAL=str(LEARN_STEPS // 4),
        GRPO_GENERATIONS="4",
        BATCH_SIZE="64",
        GRPO_MAX_COMPLETION="8",
        STEPS=str(LEARN_STEPS),
        LR="5e-4",  # at 1e-3 and above the policy swings between answering "Yes." and "No." to every prompt
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
            "learn": pool.submit(after_sft, "learn", "parity_rewards:correct"),
            "control": pool.submit(after_sft, "control", "parity_rewards:correct_shuffled"),
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


def test_a_second_iteration_trains_against_the_first_passs_log_probabilities(done):
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


def expected(row) -> dict:
    """The reward of a sampled or held-out answer to an instructed prompt ("Case N: answer Yes.")."""
    said, asked = row["answer"].split("</think>")[-1].strip(), row["text"].rsplit("answer ", 1)[-1]
    return {"parity_rewards:correct": float(said == asked), "total": float(said == asked)}


def test_each_logged_step_shows_a_group_of_training_completions_with_their_rewards(done):
    """At each logged step samples.jsonl (and samples.md) gets the step's first prompt with its 4 sampled
    completions and what the reward gave each; a resumed run writes the same ones as the run that never stopped."""
    data = str(done["tmp"] / "data" / "cases.jsonl")
    rows = [row for row in sample_rows(done["tmp"], "learn") if row["prompt"].startswith(data)]
    assert [r["step"] for r in rows] == [step for step in range(1, LEARN_STEPS + 1) for _ in range(4)]
    for step in range(1, LEARN_STEPS + 1):
        group = rows[4 * (step - 1) : 4 * step]
        assert len({(r["prompt"], r["text"]) for r in group}) == 1, group  # one prompt, its 4 completions
        for row in group:
            assert row["rewards"] == expected(row), row
            assert 0 < len(row["tokens"]) <= 8 and row["stop"] in ("end", "length"), row
    shown = (done["tmp"] / "learn" / "report" / "samples.md").read_text()
    assert f"## {rows[-1]['prompt']}" in shown
    whole, resumed = sample_rows(done["tmp"], "whole"), sample_rows(done["tmp"], "resume")
    assert [r["step"] for r in whole] == [1] * 4 + [3] * 4 + [5] * 4  # GRPO_GENERATIONS=4, two iterations
    assert resumed == whole[8:]


def validations(tmp, name) -> list:
    return [r for r in records(tmp, name) if "validation_loss" in r]


def test_grpo_learns_to_read_the_prompt_and_a_shuffled_reward_does_not(done):
    """From a model that answers "Yes." or "No." at random (SFT on random answers: about 50 % right), GRPO rewarded
    for the answer its prompt states gives over 90 % right greedy answers to held-out prompts (numbers never trained
    on, half of each answer) after the last step, where a constant answer scores 50 %: only reading the prompt
    passes. Its sampled completions (temperature 1) rise from about half to over 75 % over the last 8 steps. With
    each group's rewards shuffled (the same rewards, no link to the completions) it gets to neither."""
    learn, control = ([r for r in records(done["tmp"], name) if "loss" in r] for name in ("learn", "control"))
    assert len(learn) == len(control) == LEARN_STEPS
    assert 0.2 <= learn[0]["grpo"]["reward/mean"] <= 0.8 and control[0]["grpo"]["reward/mean"] <= 0.8
    late = lambda steps: sum(r["grpo"]["reward/mean"] for r in steps[-8:]) / 8  # noqa: E731
    assert late(learn) >= 0.75, [r["grpo"]["reward/mean"] for r in learn]
    assert late(control) < 0.6, [r["grpo"]["reward/mean"] for r in control]
    held, held_control = validations(done["tmp"], "learn"), validations(done["tmp"], "control")
    assert [v["step"] for v in held] == [1] + [LEARN_STEPS // 4 * k for k in (1, 2, 3, 4)]
    assert held[0]["grpo"]["reward/mean"] <= 0.75, held
    assert held[-1]["grpo"]["reward/mean"] >= 0.9, held
    assert held_control[-1]["grpo"]["reward/mean"] < 0.9, held_control


def test_grpo_validation_is_the_held_out_prompts_mean_reward(done):
    """Each validation answers all 16 held-out prompts greedily and scores them with the run's rewards (the mean
    reward a whole number of sixteenths), summary.json keeps the best loss, and samples.md shows 4 of the answers
    with the rewards `expected` recomputes from their text at each validation."""
    held = validations(done["tmp"], "learn")
    for v in held:
        found = v["grpo"]["rewards/parity_rewards:correct/mean"] * 16
        assert found == pytest.approx(round(v["grpo"]["reward/mean"] * 16))
        assert 0 < v["grpo"]["completions/mean_length"] <= 8
    summary = json.loads((done["tmp"] / "learn" / "report" / "summary.json").read_text())["validation"]
    assert summary["best_loss"] == min(v["validation_loss"] for v in held)
    held_out = str(done["tmp"] / "data" / "held_out.jsonl")
    rows = [row for row in sample_rows(done["tmp"], "learn") if row["prompt"].startswith(held_out)]
    assert [r["step"] for r in rows] == [step for step in [v["step"] for v in held] for _ in range(4)]
    for row in rows:
        assert row["rewards"] == expected(row), row
    shown = (done["tmp"] / "learn" / "report" / "samples.md").read_text()
    assert "| step | stop | answer | rewards |" in shown and "parity_rewards:correct" in shown
