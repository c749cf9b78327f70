"""What save on stop costs: the time from SIGTERM to the launcher's exit with a save, and the per-step agreement.

Three 2-process smoke runs (CPU, gloo) through `python -m entrypoint`, side by side in one invocation:
- stop to exit: with CHECKPOINT_DIR, SIGTERM to the launcher once step SIGNAL_AFTER is logged; seconds from the
  signal to the launcher's exit (status 143), split into the step in flight, the save of that step (the worker's
  `stop:` line) and the rest (the workers' and torchrun's exit);
- the stop agreement: the MAX all-reduce on a gloo side group at every step boundary, as the difference of the
  steady-state step time (steps 5..N, the run report's metrics) with it and without it (`--stop.no-enable`).

Run from the repo root: .venv/bin/python -m bench.bench_stop
"""

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from neuron_qwen3.prelaunch import selftest as names  # the log patterns: LOSS_LINE, COLOUR

REPO = Path(__file__).resolve().parent.parent
ANSI = re.compile(names.COLOUR)
STEP = re.compile(r"step:\s*(\d+)\s")
STOP = re.compile(
    r"stop: SIGTERM at step (\d+): saved step-\d+ \(([\d.]+) s; ([\d.]+) s since the signal\); "
    r"exiting 143"
)
SIGNAL_AFTER, STEPS = 4, 20


def run(tmp, name, *extra, stop=False) -> tuple[int, str, float | None]:
    env = dict(
        os.environ,
        VARIANT="native",
        SCALE="smoke",
        NPROC="2",
        STEPS=str(STEPS),
        PREFLIGHT="warn",
        OUTPUT_DIR=f"{tmp}/{name}/out",
        CACHE_DIR=f"{tmp}/cache",
        PYTHONUNBUFFERED="1",
        EXTRA_ARGS=" ".join(extra),
        **({"CHECKPOINT_DIR": f"{tmp}/{name}/checkpoint"} if stop else {}),
    )
    launcher = subprocess.Popen(
        [sys.executable, "-m", "entrypoint"],
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    output, signalled = [], None
    for line in launcher.stdout:
        output.append(ANSI.sub("", line))
        step = STEP.search(output[-1])
        if stop and signalled is None and step and int(step[1]) == SIGNAL_AFTER:
            launcher.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
    status = launcher.wait()
    return status, "".join(output), time.monotonic() - signalled if signalled else None


def step_time(tmp, name) -> float:
    records = [json.loads(line) for line in open(f"{tmp}/{name}/out/report/metrics.jsonl")]
    return statistics.median(r["step_time_s"] for r in records if r["step"] >= 5)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        status, output, took = run(tmp, "stopped", stop=True)
        stop = STOP.search(output)
        if status != 143 or not stop:
            print(output[-4000:])
            print(f"status {status}: no save on stop found")
            return 1
        save, in_worker = float(stop[2]), float(stop[3])
        print(
            f"SIGTERM after step {SIGNAL_AFTER} -> saved step-{stop[1]} -> launcher exit 143: {took:.2f} s "
            f"(in-flight step {in_worker - save:.2f} s, save {save:.2f} s, exits {took - in_worker:.2f} s)"
        )
        for name, extra in (("with", ()), ("without", ("--stop.no-enable",)), ("with-again", ())):
            if run(tmp, name, *extra)[0] != 0:
                print(f"the {name} run failed")
                return 1
        with_stop = statistics.mean([step_time(tmp, "with"), step_time(tmp, "with-again")])
        without = step_time(tmp, "without")
        print(
            f"stop agreement, same invocation: {with_stop:.3f} s/step with it, {without:.3f} s/step without "
            f"({100 * (with_stop - without) / without:+.2f}%)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
