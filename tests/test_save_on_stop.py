"""Nothing lost on a stop: SIGTERM mid-run, restart with the same environment, the same run as without the stop.

For each case one uninterrupted run (the baseline), one run stopped by SIGTERM to the launcher after step 1 is
logged, and one restart with the very same environment. The stop lands at the step boundary after the signal (step
2 on any machine where a step takes longer than delivering a signal), which is not a multiple of the interval (3),
so only the save on stop can have written it; every process ends within the default STOP_GRACE, and the run
report says `stopped`. Before the full fine-tune's restart a damaged newer checkpoint is planted (all files, one
shard cut short, as a save cut off by a full disk leaves it): the restart moves it aside and resumes from the
stop's. On CPU with a fixed seed the resumed run is bitwise the same: the printed losses match as strings, and the
final checkpoints (model, optimizer, schedule, data-loader position) hold identical tensors. The LoRA case trains
adapters over a base saved by transformers: its checkpoints hold the adapters (and their optimizer state) only,
and the restart loads the base from INIT_FROM again. The nki_moe case trains with both router losses on
(MOE_AUX_LOSS=0.01, MOE_Z_LOSS=0.001: moe/routing.py's hooks in every forward, their gradients through the adapters
below each router), in all three of its runs, so its bitwise resume covers them. Real torchrun runs on CPU (gloo);
about 10-20 s each. The stopped run goes alone (its time to exit is asserted), then the baseline beside the restart.
Run: .venv/bin/python -m pytest tests/test_save_on_stop.py -q -s   (-s prints the stop-to-exit figures)
"""

import functools
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import NamedTuple

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from conftest import ANSI, REPO, STEP_LOSS, beside, side_by_side_env, worker_env

from entrypoint import contract, launch as launcher
from neuron_qwen3.prelaunch import checkpoints

pytestmark = pytest.mark.training

STOPPED_AT = re.compile(r"stop: SIGTERM at step (\d+): saved step-\d+")
STEPS, INTERVAL, SIGNAL_AFTER = 6, 3, 1
# the user's bound: the step in flight and the save fit in it
STOP_GRACE = int({var.name: var.default for var in contract.VARS}["STOP_GRACE"])
# (variant, processes, LoRA), each on 2 ranks (FSDP: every rank saves its shards, all agree on the stop step).
# nki_moe resumes with LoRA over its experts (its NKI experts' forward and backward in every step); LoRA's
# checkpoints hold adapters and optimizer only, its base loads from INIT_FROM. One rank: the epochs case below.
CASES = [("native", 2, False), ("nki_moe", 2, True)]
LORA = {
    "native": {"LORA_RANK": "4"},
    "nki_moe": {"LORA_RANK": "4", "LORA_TARGETS": "q_proj,v_proj,experts.gate_up_proj,experts.down_proj"},
}
# The MoE router losses, on in every run of the variant's case (baseline, stopped, resumed): part of each step's
# loss and gradients, so the resume is bitwise with them too. Not Qwen3-MoE's 0.001 default: set, and larger.
ROUTER_LOSSES = {"nki_moe": {"MOE_AUX_LOSS": "0.01", "MOE_Z_LOSS": "0.001"}}


def losses(output: str) -> dict[int, str]:
    """{step: loss as printed}: compared as text, so equal means bitwise equal to the printed precision."""
    return {int(step): loss for step, loss in STEP_LOSS.findall(ANSI.sub("", output))}


def base_model(tmp, variant) -> str:
    """A random model of the variant's smoke shape saved by transformers: the base a LoRA case trains over."""
    import transformers

    from neuron_qwen3 import config_registry
    from neuron_qwen3.hf import weights

    folder = f"{tmp}/{variant}-base"
    if not os.path.isdir(folder):
        torch.manual_seed(0)
        if variant == "nki_moe":
            config = config_registry.nki_moe_qwen3_smoke()
            config.checkpoint.initial_load_in_hf = True
            weights.hf_compatible(config)
            model = transformers.Qwen3MoeForCausalLM(
                transformers.Qwen3MoeConfig(**weights.native_hf_config(config.model_spec.model, {}))
            )
        else:
            import json

            shape = json.loads((config_registry.HF_MODEL["smoke"] / "config.json").read_text())
            model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**shape))
        model.save_pretrained(folder)
    return folder


def env_for(tmp, name, variant, nproc, lora=False):
    case = f"{variant}-{nproc}{'-lora' if lora else ''}-{name}"
    extra = {"INIT_FROM": base_model(tmp, variant), **LORA[variant]} if lora else {}
    return side_by_side_env(
        VARIANT=variant,
        SCALE="smoke",
        NPROC=str(nproc),
        STEPS=str(STEPS),
        CHECKPOINT_INTERVAL=str(INTERVAL),
        OUTPUT_DIR=f"{tmp}/{case}/out",
        CHECKPOINT_DIR=f"{tmp}/{case}/checkpoint",
        CACHE_DIR=f"{tmp}/cache",
        PREFLIGHT="warn",
        **extra,
        **ROUTER_LOSSES.get(variant, {}),
    )


class Run(NamedTuple):
    status: int
    output: str
    took: float | None  # seconds from the signal to the launcher's exit
    outlived: list  # the processes under the launcher at the signal that outlived it


def launch(env, stop_after=None) -> Run:
    """Run the launcher; with `stop_after`, SIGTERM it once that step's loss is logged."""
    process = subprocess.Popen(
        [sys.executable, "-m", "entrypoint"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines, signalled, below = [], None, []
    try:
        for line in process.stdout:
            lines.append(line)
            step = STEP_LOSS.search(ANSI.sub("", line))
            if stop_after and signalled is None and step and int(step[1]) == stop_after:
                below = launcher.descendants(process.pid)
                process.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
        status = process.wait(timeout=600)
    finally:
        process.kill()
    took = time.monotonic() - signalled if signalled else None
    outlived = [pid for pid in below if launcher.process_table().get(pid, (0, 0, "Z"))[2] != "Z"]
    return Run(status, "".join(lines), took, outlived)


def explain(output: str) -> str:
    """What a failed run printed outside rank 0's training log (the launcher's and torchrun's lines), then its tail."""
    own = [line for line in output.splitlines() if not line.startswith("[rank0]:[titan]")]
    return "\n".join(own[-60:]) + "\n--- tail ---\n" + output[-2000:]


def plant_damaged(checkpoint_dir, step) -> str:
    """A copy of step-`step` three steps newer (never one the run writes: the interval is 3), one shard halved."""
    damaged = os.path.join(checkpoint_dir, f"step-{step + INTERVAL}")
    shutil.copytree(os.path.join(checkpoint_dir, f"step-{step}"), damaged)
    shard = sorted(name for name in os.listdir(damaged) if name.endswith(".distcp"))[0]
    os.truncate(os.path.join(damaged, shard), os.path.getsize(os.path.join(damaged, shard)) // 2)
    return damaged


class Case(NamedTuple):
    baseline: Run
    stopped: Run
    resumed: Run  # the same environment as `stopped`
    env: dict
    left: checkpoints.Scan  # the checkpoint folder as the stop left it
    report: dict  # the stopped run's summary.json
    damaged: str | None  # the damaged checkpoint planted before the restart


@functools.cache
def runs(tmp, variant, nproc, lora) -> Case:
    baseline_env, env = (env_for(tmp, name, variant, nproc, lora) for name in ("baseline", "stopped"))
    stopped = launch(env, stop_after=SIGNAL_AFTER)
    left = checkpoints.scan(env["CHECKPOINT_DIR"])
    with open(f"{env['OUTPUT_DIR']}/report/summary.json") as f:
        report = json.load(f)
    damaged = None if lora or left.latest is None else plant_damaged(env["CHECKPOINT_DIR"], left.latest)
    baseline, resumed = beside(lambda: launch(baseline_env), lambda: launch(env))
    return Case(baseline, stopped, resumed, env, left, report, damaged)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("stop"))


def final_state(checkpoint_dir, out):
    dcp_to_torch_save(os.path.join(checkpoint_dir, f"step-{STEPS}"), out)
    return torch.load(out, weights_only=False)


def same(a, b, path="") -> list:
    """The paths where two nested checkpoint states differ (tensors compared bitwise). torchtitan keeps each
    rank's data-loader state as pickled bytes, and pickle's bytes depend on which strings are one object (its memo),
    not only on the state, so those are compared unpickled."""
    if isinstance(a, bytes) and isinstance(b, bytes):
        return same(pickle.loads(a), pickle.loads(b), path)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        equal = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
        return [] if equal else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [diff for key in a for diff in same(a[key], b[key], f"{path}/{key}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [diff for i, (x, y) in enumerate(zip(a, b)) for diff in same(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


@pytest.mark.parametrize("variant, nproc, lora", CASES)
def test_a_stop_saves_the_current_step_and_exits_143(tmp, variant, nproc, lora):
    case = runs(tmp, variant, nproc, lora)
    status, output, took, outlived = case.stopped
    assert status == 143, explain(output)
    assert took < STOP_GRACE + 1 and not outlived, (took, outlived)  # every process gone within the bound
    stop = STOPPED_AT.search(output)
    assert stop, output[-3000:]
    k = int(stop[1])
    assert k % INTERVAL and k < STEPS, f"stopped at step {k}: not a save only the stop can have written"
    assert sorted(losses(output)) == list(range(1, k + 1))  # it finished the step it was in, and began no other
    assert case.left.latest == k and not case.left.broken  # complete: .metadata and every byte range it names
    assert "killing process groups" not in output  # everything ended by itself, no SIGKILL at the grace
    # the run report says stopped (not failed), at that step
    assert case.report["end"] == "stopped" and case.report["steps"] == {"done": k, "planned": STEPS}, case.report
    assert os.path.exists(f"{case.env['OUTPUT_DIR']}/report/loss.png")
    detail = re.search(r"stop: .*", ANSI.sub("", output))[0]
    print(
        f"\n{variant} x{nproc}{' LoRA' if lora else ''}: SIGTERM to the launcher -> exit 143 in {took:.2f} s; "
        f"worker: {detail}"
    )


@pytest.mark.parametrize("variant, nproc, lora", CASES)
def test_the_restart_continues_at_the_next_step_with_the_same_losses(tmp, variant, nproc, lora):
    case = runs(tmp, variant, nproc, lora)
    (base_status, base_out, *_), stopped_out, (status, output, *_) = case.baseline, case.stopped.output, case.resumed
    assert base_status == 0, explain(base_out)
    assert status == 0, explain(output)
    k = int(STOPPED_AT.search(stopped_out)[1])
    assert f"Training starts at step {k + 1}" in ANSI.sub("", output)
    if case.damaged:  # moved aside with one warning; the stop's checkpoint is the newest complete one
        warnings = [line for line in output.splitlines() if line.startswith("entrypoint: warning: checkpoint")]
        assert len(warnings) == 1 and f"{case.damaged} is broken" in warnings[0], output[-3000:]
        assert f"entrypoint: checkpoints: resuming from step {k} in {case.env['CHECKPOINT_DIR']}" in output
    resumed, baseline = losses(output), losses(base_out)
    assert sorted(resumed) == list(range(k + 1, STEPS + 1))
    assert {step: baseline[step] for step in resumed} == resumed  # step for step, as printed
    assert {step: baseline[step] for step in range(1, k + 1)} == losses(stopped_out)


@pytest.mark.parametrize("variant, nproc, lora", CASES)
def test_the_resumed_run_ends_bitwise_where_the_uninterrupted_one_does(tmp, variant, nproc, lora):
    env = runs(tmp, variant, nproc, lora).env
    case = f"{variant}-{nproc}{'-lora' if lora else ''}"
    resumed = final_state(env["CHECKPOINT_DIR"], f"{tmp}/{case}-resumed.pt")
    baseline = final_state(env_for(tmp, "baseline", variant, nproc, lora)["CHECKPOINT_DIR"], f"{tmp}/{case}-base.pt")
    assert any(key.startswith("optimizer") for key in resumed) and "dataloader" in str(sorted(resumed))
    assert same(baseline, resumed) == []
    weights = [key for key, value in resumed.items() if isinstance(value, torch.Tensor)]
    assert all(key.endswith((".lora_A", ".lora_B")) for key in weights) == lora  # LoRA: no base weight saved
    if variant in ROUTER_LOSSES:  # the baseline and the restart (its report) trained with the router losses
        for name in ("baseline", "stopped"):
            with open(f"{env_for(tmp, name, variant, nproc, lora)['OUTPUT_DIR']}/report/config.json") as f:
                moe = json.load(f)["moe"]
            assert (moe["aux_loss"], moe["z_loss"]) == (0.01, 0.001), moe


def test_the_article_command_typed_by_hand_saves_on_sigterm_too(tmp):
    """No launcher: `torchrun ... -m torchtitan.train --module neuron_qwen3 --config ...` as the article types it.
    The config's own trainer carries the stop hook, so SIGTERM to torchrun (which forwards it to the workers) still
    ends the run at a step boundary with a complete checkpoint of that step, and the report says `stopped`."""
    folder = f"{tmp}/by-hand"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "127.0.0.1:0",
        "--local-addr",
        "127.0.0.1",
        "--local-ranks-filter",
        "0",
        "--role",
        "rank",
        "--tee",
        "3",
        "-m",
        "torchtitan.train",
        "--module",
        "neuron_qwen3",
        "--config",
        "native_qwen3_smoke",
        f"--training.steps={STEPS}",
        "--checkpoint.enable",
        f"--checkpoint.folder={folder}/checkpoint",
        f"--checkpoint.interval={INTERVAL}",
        f"--dump_folder={folder}/out",
    ]
    torchrun = subprocess.Popen(
        command, env=worker_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    try:
        for line in torchrun.stdout:
            lines.append(line)
            step = STEP_LOSS.search(ANSI.sub("", line))
            if step and int(step[1]) == SIGNAL_AFTER:
                torchrun.send_signal(signal.SIGTERM)
                break
        output = "".join(lines) + torchrun.communicate(timeout=600)[0]
    finally:
        torchrun.kill()
    stop = STOPPED_AT.search(output)
    assert stop, explain(output)
    k = int(stop[1])
    left = checkpoints.scan(f"{folder}/checkpoint")
    assert k % INTERVAL and left.latest == k and not left.broken, (k, left)
    summary = json.loads(open(f"{folder}/out/report/summary.json").read())
    assert summary["end"] == "stopped" and summary["config"] == "native_qwen3_smoke" and summary["processes"] == 2


EPOCH_WINDOWS, EPOCHS, EPOCH_SIGNAL_AFTER = 11, 3, 6  # 33 windows = 17 steps of 2; step 6 reads windows 11 and 12


def eleven_windows(tmp) -> str:
    """Texts of the smoke corpus that pack into exactly 11 windows of the smoke config. With local batch 2 and
    EPOCHS=3 that is 33 windows = 17 steps (the last one padded): step 6 reads the last window of epoch 1 and the
    first of epoch 2, step 11 its last two, so a stop at any of steps 6-10 lands in the middle of epoch 2. The
    signal goes after step 6's loss is logged; the slack of four steps is for a slow machine's signal delivery.
    An epoch's summary line comes when the next window is asked for, so the third epoch is there to show the
    second one's."""
    from neuron_qwen3 import config_registry
    from neuron_qwen3.data.packing import windows
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(config_registry.SMOKE_TOKENIZER))
    texts = [json.loads(line)["text"] for line in (config_registry.SMOKE_CORPUS / "train.jsonl").open()][:60]
    for k in range(1, len(texts)):
        lengths = [[len(tokenizer.encode(t, add_bos=True, add_eos=True)) - 1] for t in texts[:k]]
        if windows(lengths, 256, whole=False) == EPOCH_WINDOWS:
            with open(f"{tmp}/eleven.jsonl", "w") as f:
                f.writelines(json.dumps({"text": t}) + "\n" for t in texts[:k])
            return f"{tmp}/eleven.jsonl"
    raise AssertionError(f"no prefix of the corpus packs into {EPOCH_WINDOWS} windows")


@functools.cache
def epoch_runs(tmp):
    data = eleven_windows(tmp)

    def env(name):  # an interval beyond the run: the stop's save is the only checkpoint the restart can load
        found = {
            **env_for(tmp, f"epochs-{name}", "native", 1),
            "EPOCHS": str(EPOCHS),
            "DATASET": data,
            "CHECKPOINT_INTERVAL": "100",
        }
        del found["STEPS"]
        return found

    stopped = launch(env("stopped"), stop_after=EPOCH_SIGNAL_AFTER)
    baseline, resumed = beside(lambda: launch(env("baseline")), lambda: launch(env("stopped")))
    return baseline, stopped, resumed


def test_a_stop_in_the_middle_of_epoch_2_resumes_there_with_the_same_losses(tmp):
    (base_status, base_out, *_), (status, stopped_out, *_), (resumed_status, resumed_out, *_) = epoch_runs(tmp)
    steps = -(-EPOCHS * EPOCH_WINDOWS // 2)
    assert base_status == 0, explain(base_out)
    assert f"epochs: {EPOCHS} epochs = {steps} steps of 2 sequences" in ANSI.sub("", base_out)
    assert sorted(losses(base_out)) == list(range(1, steps + 1))  # the run ends after the epochs
    stop = STOPPED_AT.search(stopped_out)
    assert status == 143 and stop, explain(stopped_out)
    k = int(stop[1])
    assert EPOCH_SIGNAL_AFTER <= k < EPOCH_WINDOWS, f"stopped at step {k}: not in the middle of epoch 2"
    assert "data: epoch 0 read" in stopped_out and "data: epoch 1 read" not in stopped_out  # it stopped in epoch 2
    assert resumed_status == 0, explain(resumed_out)
    assert f"Training starts at step {k + 1}" in ANSI.sub("", resumed_out)
    assert "data: epoch 0 read" not in resumed_out and "data: epoch 1 read" in resumed_out  # and resumed in it
    assert "data: epoch 2 read" in resumed_out
    baseline = losses(base_out)
    assert {**losses(stopped_out), **losses(resumed_out)} == baseline  # step for step, as printed
