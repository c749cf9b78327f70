"""A broken run stops on its loss (divergence.py): the rule on made-up losses, then real smoke runs through the
launcher with a NaN or a spike injected at one step by a recipes module of the test's own (MODULE, CONFIG).

Run: .venv/bin/python -m pytest tests/test_divergence.py -q   (the two runs: about 20-40 s each on CPU)
"""

import os
import re
import subprocess
import sys

import pytest

from conftest import ANSI, REPO, STEP_LOSS, worker_env

from neuron_qwen3.prelaunch import checkpoints

# A user's recipes module: the smoke trainer, whose logged loss is multiplied by `inject_factor` at `inject_step`

from neuron_qwen3.run import divergence

# (the weights are not touched: the stop, not the damage, is under test). Its exit handler, registered at import,
# before the trainer's teardown.py, runs after it and says whether the process group was destroyed and how many
# trainers are still alive.
INJECTING = """
import atexit
import gc
import sys
from dataclasses import dataclass

import torch.distributed as dist

from neuron_qwen3 import config_registry
from neuron_qwen3.trainer import Qwen3Trainer


class Injecting(Qwen3Trainer):
    @dataclass(kw_only=True, slots=True)
    class Config(Qwen3Trainer.Config):
        inject_step: int = 0
        inject_factor: float = 1.0

    def forward_backward_step(self, *args, **kwargs):
        loss = super().forward_backward_step(*args, **kwargs)
        return loss * self.config.inject_factor if self.step == self.config.inject_step else loss


def injected_smoke():
    return config_registry._as(config_registry.native_qwen3_smoke(), Injecting.Config)


@atexit.register
def say_process_group():
    trainers = sum(Qwen3Trainer in type(o).__mro__ for o in gc.get_objects())  # the trainer's cycles, collected?
    print(f"at exit: process group {'alive' if dist.is_initialized() else 'destroyed'}, {trainers} trainers",
          file=sys.stderr, flush=True)
"""


def watch(policy="stop", losses=()):
    watched = divergence.LossWatch(policy)
    for step, loss in enumerate(losses, 1):
        watched.judge(step, loss)
    return watched


FALLING = [10.0, 9.0, 8.2, 7.6, 7.1, 6.8, 6.6, 6.5]


def test_a_falling_or_noisy_curve_passes_and_a_jump_stops_naming_step_and_loss():
    watch(losses=FALLING + [6.9, 6.2, 6.6])  # noise within the spread
    with pytest.raises(divergence.Diverged) as stopped:
        watch(losses=FALLING + [19.0])
    assert stopped.value.code == divergence.DIVERGED == 3
    assert stopped.value.args[0] == (  # median 7.35, median absolute deviation 0.8
        "divergence: step 9: the loss 19.0000 jumped above 15.3500 (median 7.3500 + 10 x spread 0.8000 of the last 8 "
        "logged losses): stopping before this step is saved (exit 3; NAN_POLICY=warn goes on after a spike)"
    )


def test_the_rule_waits_for_five_losses_and_a_flat_curve_has_a_three_percent_floor():
    watch(losses=[2.0, 9.0])  # too few to judge a jump
    watch(losses=[2.0] * 6 + [2.59])  # flat: median 2 + 10 x 3 % of 2 = 2.6
    with pytest.raises(divergence.Diverged):
        watch(losses=[2.0] * 6 + [2.61])


@pytest.mark.parametrize("loss", [float("nan"), float("inf")])
@pytest.mark.parametrize("policy", ["stop", "warn"])
def test_a_non_finite_loss_stops_whatever_the_policy(policy, loss):
    with pytest.raises(
        divergence.Diverged,
        match=rf"^divergence: step 3: the loss is {loss}: stopping before this "
        r"step is saved \(exit 3\)$",
    ):
        watch(policy, [5.0, 4.0, loss])


def test_warn_goes_on_after_a_spike_and_the_spike_joins_the_history():
    watched = watch("warn", FALLING + [19.0, 6.4])
    assert list(watched.losses)[-2:] == [19.0, 6.4]


def test_torchtitans_non_finite_error_becomes_the_line_and_others_pass_through():
    with pytest.raises(divergence.Diverged, match="^divergence: step 7: the loss is nan: stopping"):
        divergence.not_finite(
            watch(), RuntimeError("Loss is not finite (global_avg_loss=nan) at step 7. Stopping training.")
        )
    divergence.not_finite(watch(), RuntimeError("CUDA out of memory"))  # returns: the caller re-raises it


# ---- real runs --------------------------------------------------------------------------------------------------

STEPS, INJECT_AT = 8, 6


def run(tmp_path, factor, **env):
    package = tmp_path / "user" / "diverging"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(INJECTING)
    path = os.pathsep.join(filter(None, [str(package.parent), os.environ.get("PYTHONPATH")]))
    env = worker_env(
        PYTHONPATH=path,
        SCALE="smoke",
        MODULE="diverging",
        CONFIG="injected_smoke",
        STEPS=str(STEPS),
        CHECKPOINT_DIR=str(tmp_path / "checkpoint"),
        CHECKPOINT_INTERVAL="1",
        OUTPUT_DIR=str(tmp_path / "out"),
        CACHE_DIR=str(tmp_path / "cache"),
        EXTRA_ARGS=f"--inject_step={INJECT_AT} --inject_factor={factor}",
        **env,
    )
    result = subprocess.run(
        [sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=600
    )
    return result, ANSI.sub("", result.stdout + result.stderr)


def lines_of(output, text):
    return [line for line in output.splitlines() if text in line]


@pytest.mark.training
def test_a_nan_stops_the_run_in_one_line_and_the_newest_checkpoint_is_the_last_good_step(tmp_path):
    """On 2 ranks: every rank holds the same global loss, so all stop at the same step (one rank is the same
    check without the agreement)."""
    result, output = run(tmp_path, "nan", NPROC="2")
    assert result.returncode == 1, output[-3000:]  # torchrun's status for a failed worker; the worker's is 3
    assert re.search(r"Root Cause[^=]*exitcode\s+: 3 ", output), output[-3000:]  # in torchrun's box
    stop = lines_of(output, "divergence:")  # the console shows rank 0 (LOG_RANK)
    assert len(stop) == 1 and stop[0].endswith(
        f"divergence: step {INJECT_AT}: the loss is nan: stopping before this step is saved (exit 3)"
    ), stop
    assert "Loss is not finite" not in output  # torchtitan's traceback is replaced by the line
    assert [int(step) for step, _ in STEP_LOSS.findall(output)] == list(range(1, INJECT_AT))
    assert checkpoints.scan(tmp_path / "checkpoint").latest == INJECT_AT - 1
    assert not (tmp_path / "checkpoint" / f"step-{INJECT_AT}").exists()
    summary = (tmp_path / "out" / "report" / "summary.json").read_text()
    assert '"end": "failed"' in summary and f"Diverged: divergence: step {INJECT_AT}" in summary
    # destroyed before interpreter finalization, where gloo's threads now and then abort the exit (teardown.py)
    exits = lines_of(output, "at exit: process group")
    assert exits == ["[rank0]:at exit: process group destroyed, 0 trainers"], output[-3000:]


@pytest.mark.training
def test_a_spike_is_one_warning_with_nan_policy_warn_and_the_run_finishes(tmp_path):
    result, output = run(tmp_path, "100", NAN_POLICY="warn")
    assert result.returncode == 0, output[-3000:]
    warned = lines_of(output, "divergence:")
    assert len(warned) == 1 and re.search(
        rf"divergence: step {INJECT_AT}: the loss \S+ jumped above .*: going on "
        r"\(NAN_POLICY=warn\)$",
        warned[0],
    ), warned
    assert checkpoints.scan(tmp_path / "checkpoint").latest == STEPS
    # a finished worker runs its exit handlers after torchtitan's last line, inside its main(), which still holds
    # the trainer, and ends with no finalization to abort (quirks/worker_exit.py)
    assert lines_of(output, "at exit: process group") == ["[rank0]:at exit: process group destroyed, 1 trainers"]
