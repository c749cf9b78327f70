"""METHOD=grpo through the launcher against TRL 1.16's GRPOTrainer on the same completions, for every variant.

Each run (smoke models from INIT_FROM folders written here, float32, 2 prompts x 4 completions a generation in
one micro-batch, GRPO_ITERATIONS=2, 2 steps, a checkpoint at step 1; RUNS): native (dapo, beta 0) and v5 (grpo,
beta 0.04) on 1 rank, nki_moe on 2 (FSDP; dr_grpo, beta 0.04, the MoE load-balancing loss on, as INIT_FROM's
router_aux_loss_coef asks), native with LoRA (dapo, beta 0.04: the reference is the base with the adapters off on
both sides). The reward is a function of the completion's tokens, so both sides score them alike. Step 1's
checkpoint holds every rank's generation (the rows it trains, with the generator's log-probabilities); TRL
(tests/scenarios/trl_grpo.py) gets the same prompts and completions through its `rollout_func` and trains two
steps on them, with LoRA on a PEFT model of the run's own adapters as they started (a one-step run's export: a
first step moves B from 0 but leaves A, whose gradient is 0 while B is). Step 2 trains the same completions again
after one AdamW step on both sides, so it checks the gradient and the optimizer too. The loss function alone
against TRL, over every loss type and setting: tests/test_grpo_trl.py.
Run: .venv/bin/python -m pytest tests/test_grpo_trl_runs.py -q
"""

import functools
import json
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import REPO, random_smoke_model, rank_logs, scenario_json, side_by_side_env
from qwen_size import SMOKE_TOKENIZER

pytestmark = pytest.mark.training
GENERATIONS, PROMPTS, MAX_COMPLETION, LR = 4, 2, 12, 1e-3
REWARD = """
def spread(completion_ids, **kwargs):
    return [float(ids[0] % 3) + 0.25 * len(ids) for ids in completion_ids]
"""
QUESTIONS = ["Name a colour.", "Count to three."]
AS_TRL = "--training.mixed_precision_param float32 --optimizer.param_groups.0.optimizer_kwargs.weight_decay 0"
RUNS = {  # variant, ranks, GRPO_LOSS, GRPO_BETA, LoRA
    "native": ("native", 1, "dapo", 0.0, False),
    "v5": ("v5", 1, "grpo", 0.04, False),
    "nki_moe": ("nki_moe", 2, "dr_grpo", 0.04, False),
    "native-lora": ("native", 1, "dapo", 0.04, True),  # the reference: the base, adapters off, on both sides
}
LORA = dict(LORA_RANK="8", LORA_ALPHA="16")


def launch(tmp, name, out, **env):
    variant, nproc, loss, beta, lora = RUNS[name]
    batch = GENERATIONS * PROMPTS
    settings = dict(
        SCALE="smoke",
        VARIANT=variant,
        NPROC=str(nproc),
        OUTPUT_DIR=str(tmp / out),
        GRPO_LOSS=loss,
        GRPO_BETA=str(beta),
        METHOD="grpo",
        DATASET=str(tmp / "data" / "prompts.jsonl"),
        GRPO_REWARDS="trl_rewards:spread",
        GRPO_GENERATIONS=str(GENERATIONS),
        GRPO_MAX_COMPLETION=str(MAX_COMPLETION),
        GRPO_ITERATIONS="2",
        BATCH_SIZE=str(batch),
        SEQ_LEN="64",
        STEPS="2",
        LR=str(LR),
        WARMUP_STEPS="0",
        EXTRA_ARGS=f"{AS_TRL} --training.local_batch_size {batch // nproc}",
        **(LORA if lora else {}),
    )
    env = side_by_side_env(**{**settings, **env})
    return subprocess.run(
        [sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
    )


def generation(checkpoint, ranks: int, records: list) -> list:
    """Every rank's first generation from the step-1 checkpoint, as the rollouts trl_grpo.py takes: each prompt's
    record, its token ids, and its completions' token ids and the generator's log-probabilities."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from torchtitan.components.loss import IGNORE_INDEX
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3.data.tokens import Encoder

    whole = checkpoint.parent / "step-1.pt"
    dcp_to_torch_save(str(checkpoint), str(whole))
    state = torch.load(whole, weights_only=False)
    encoder = Encoder(HuggingFaceTokenizer(tokenizer_path=str(SMOKE_TOKENIZER)))
    by_ids = {tuple(encoder.prompt(r["prompt"], None, None)): r["prompt"] for r in records}
    rollouts = {}
    for rank in range(ranks):
        _, buffer = pickle.loads(find(state, f"grpo_generation_rank_{rank}"))
        for columns, labels in buffer:
            for row, label, old in zip(columns["input"], labels, columns["old"]):
                at = (label != IGNORE_INDEX).nonzero().flatten()
                first, end = int(at[0]), int(at[-1]) + 1
                prompt_ids = row[: first + 1].tolist()
                entry = rollouts.setdefault(
                    tuple(prompt_ids),
                    {"prompt": by_ids[tuple(prompt_ids)], "prompt_ids": prompt_ids, "completions": [], "logprobs": []},
                )
                entry["completions"].append(label[first:end].tolist())
                entry["logprobs"].append(old[first:end].tolist())
    return list(rollouts.values())


def find(state, key):
    """`key`'s value anywhere in the nested checkpoint state."""
    if isinstance(state, dict):
        if key in state:
            return state[key]
        for value in state.values():
            found = find(value, key)
            if found is not None:
                return found
    return None


def trl(tmp, name, rollouts, policy, adapter=None):
    path = tmp / "data" / f"{name}-rollouts.json"
    path.write_text(json.dumps(rollouts))
    settings = tmp / f"{name}-settings.json"
    settings.write_text(
        json.dumps(
            dict(
                generations=GENERATIONS,
                max_completion=MAX_COMPLETION,
                lr=LR,
                beta=RUNS[name][3],
                loss=RUNS[name][2],
                steps=2,
                iterations=2,
                rewards="trl_rewards:spread",
            )
        )
    )
    return scenario_json("trl_grpo", policy, str(path), str(SMOKE_TOKENIZER), str(settings), *filter(None, [adapter]))


@functools.cache
def runs(tmp):
    dense, moe = random_smoke_model(tmp / "dense", 0), random_smoke_model(tmp / "moe", 0, moe=True)
    records = [{"prompt": [{"role": "user", "content": q}]} for q in QUESTIONS]
    (tmp / "data").mkdir()
    (tmp / "data" / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp / "data" / "trl_rewards.py").write_text(REWARD)
    policy = {"native": dense, "v5": dense, "nki_moe": moe}

    def both(name):
        variant, ranks, *_, lora = RUNS[name]
        checkpoint = tmp / f"{name}-checkpoint"
        ours = launch(
            tmp, name, name, INIT_FROM=policy[variant], CHECKPOINT_DIR=str(checkpoint), CHECKPOINT_INTERVAL="1"
        )
        adapter = None
        if lora and not ours.returncode:  # the adapters as the run started: one step's export, its B set to 0
            adapter = str(tmp / f"{name}-step-1")
            first = launch(
                tmp, name, f"{name}-1", INIT_FROM=policy[variant], STEPS="1", EXPORT_DIR=adapter, EXPORT_DTYPE="float32"
            )
            ours = ours if first.returncode == 0 else first
        if ours.returncode:
            return ours, None, None
        rollouts = generation(checkpoint / "step-1", ranks, records)
        return ours, rollouts, trl(tmp, name, rollouts, policy[variant], adapter)

    with ThreadPoolExecutor(2) as pool:
        found = dict(zip(RUNS, pool.map(both, RUNS)))
    return {"tmp": tmp, "runs": found}


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    return runs(tmp_path_factory.mktemp("grpo-trl"))


def steps(tmp, name) -> list:
    lines = (tmp / name / "report" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "loss" in r]


@pytest.mark.parametrize("name", list(RUNS))
def test_two_steps_on_one_generation_are_trls(done, name):
    """Step 1, on the policy that generated: the loss and the gradient norm within 1e-5 relative of TRL's, every
    completion of every rank in one batch. Step 2 trains the same completions after one AdamW step on both sides
    (the ratio now off 1, KL to the reference where beta > 0): within 1e-4, as after DPO's first step. nki_moe's
    loss holds the MoE load-balancing term on both sides."""
    result, rollouts, theirs = done["runs"][name]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + rank_logs(done["tmp"] / name)
    assert (done["tmp"] / f"{name}-step-1" / "adapter_config.json").exists() == RUNS[name][4]  # a PEFT adapter
    assert sorted(len(r["completions"]) for r in rollouts) == [GENERATIONS] * PROMPTS  # both prompts, every rank's
    assert theirs["aux"] == (RUNS[name][0] == "nki_moe")
    first, second = steps(done["tmp"], name)
    trl_first, trl_second = theirs["logs"]
    assert (first["step"], second["step"]) == (trl_first["step"], trl_second["step"]) == (1, 2)
    # at step 1 the ratio is 1: the loss is the advantages' token-weighted mean, 0 up to float error (but nki_moe's
    # load-balancing term)
    assert first["loss"] == pytest.approx(trl_first["loss"], rel=1e-5, abs=1e-6), (first, trl_first)
    assert first["grad_norm"] == pytest.approx(trl_first["grad_norm"], rel=1e-5), (first, trl_first)
    assert abs(second["loss"] - first["loss"]) > 1e-2  # the update moved the policy
    assert second["loss"] == pytest.approx(trl_second["loss"], rel=1e-4), (second, trl_second)
    assert second["grad_norm"] == pytest.approx(trl_second["grad_norm"], rel=1e-4), (second, trl_second)
