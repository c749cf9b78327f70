"""What the launcher costs: its start-up, and training throughput through it versus torchrun typed by hand.

- start: the launcher is PID 1 of the container and imports only the stdlib: the goal is a median
  `python -m entrypoint --help` (every launcher module imported) under 0.15 s, with the bare interpreter measured
  interleaved as the baseline. Beside it, `--dry-run`, which also runs the recipes' pre-launch pass in a child
  (torch and torchtitan imported: seconds), the cost every launch pays before torchrun starts.
- throughput: smoke training through `python -m entrypoint` versus the very same torchrun command and environment
  (taken from --dry-run) run by hand, alternating which goes first; steady-state seconds per step come from the
  trainer's own log timestamps (steps 5..N). Goal: launcher/by-hand throughput ratio >= 0.97. Also reports the
  time from `python -m entrypoint` to the first logged training step, which is what a user waits for.
Machines here are noisy, so every figure is a ratio of runs made side by side in one invocation.

Run from the repo root: .venv/bin/python -m bench.bench_entrypoint [start|throughput ...]
"""

import json
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from neuron_qwen3.prelaunch import selftest as names  # the log patterns: LOSS_LINE, COLOUR

REPO = Path(__file__).resolve().parent.parent
START_GOAL_S = 0.15
THROUGHPUT_GOAL = 0.97
STEP_LINE = re.compile(r"\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?step:\s*(\d+)\s")


def wall(argv, env=None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def start(runs: int = 20, dry_runs: int = 3) -> dict:
    bare, launcher, dry = [], [], []
    env = dict(os.environ, SCALE="smoke")  # without an accelerator the launcher refuses an unset SCALE (full)
    for i in range(runs):
        bare.append(wall([sys.executable, "-c", "pass"]))
        launcher.append(wall([sys.executable, "-m", "entrypoint", "--help"], env))
        if i < dry_runs:
            dry.append(wall([sys.executable, "-m", "entrypoint", "--dry-run"], env))
    median, baseline = statistics.median(launcher), statistics.median(bare)
    return {
        "launcher_start_median_s": median,
        "python_median_s": baseline,
        "ratio": median / baseline,
        "dry_run_with_pre_launch_pass_median_s": statistics.median(dry),
        "goal_met": median < START_GOAL_S,
    }


def timed_training(argv, env) -> tuple[float, float]:
    """(seconds to the first logged step, steady-state seconds per step) of one training run."""
    start = time.perf_counter()
    first_step_s, stamps = None, {}
    with subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        for line in p.stdout:
            match = STEP_LINE.search(re.sub(names.COLOUR, "", line))
            if match:
                first_step_s = first_step_s or time.perf_counter() - start
                stamps[int(match.group(2))] = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
    assert p.returncode == 0 and len(stamps) > 6, f"training failed (exit {p.returncode})"
    last = max(stamps)
    return first_step_s, (stamps[last] - stamps[5]).total_seconds() / (last - 5)


def throughput(runs: int = 3, steps: int = 30) -> dict:
    env = dict(os.environ, SCALE="smoke", STEPS=str(steps), OUTPUT_DIR="/tmp/bench-entrypoint")
    plan = json.loads(
        subprocess.run(
            [sys.executable, "-m", "entrypoint", "--dry-run"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    by_hand = (plan["argv"], {**env, **plan["env"]})
    through_launcher = ([sys.executable, "-m", "entrypoint"], env)
    launcher_step, hand_step, first_step = [], [], []
    for i in range(runs):
        order = [("launcher", through_launcher), ("hand", by_hand)]
        for name, (argv, run_env) in order if i % 2 == 0 else reversed(order):
            to_first, per_step = timed_training(argv, run_env)
            (launcher_step if name == "launcher" else hand_step).append(per_step)
            if name == "launcher":
                first_step.append(to_first)
    ratio = statistics.median(hand_step) / statistics.median(launcher_step)  # throughput = 1 / seconds per step
    return {
        "variant": plan["variant"],
        "nproc": plan["nproc"],
        "launcher_s_per_step": statistics.median(launcher_step),
        "by_hand_s_per_step": statistics.median(hand_step),
        "throughput_ratio": ratio,
        "time_to_first_step_s": statistics.median(first_step),
        "goal_met": ratio >= THROUGHPUT_GOAL,
    }


MEASUREMENTS = {"start": start, "throughput": throughput}


def main() -> int:
    met = True
    for name in sys.argv[1:] or MEASUREMENTS:
        figures = MEASUREMENTS[name]()
        met &= figures.get("goal_met", True)
        shown = [
            f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}" for key, value in figures.items()
        ]
        print(f"{name}: " + ", ".join(shown), flush=True)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
