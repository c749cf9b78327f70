"""What save on stop costs: the time from SIGTERM to the launcher's exit with a save, and the per-step agreement.

One 2-process smoke run (CPU, gloo) through `python -m entrypoint` with CHECKPOINT_DIR, SIGTERM to the launcher
once step SIGNAL_AFTER is logged. Reported side by side from that one run:
- stop to exit: seconds from the signal to the launcher's exit (status 143), split into the step that was in
  flight, the save of that step, and the rest (the workers' and torchrun's exit);
- the stop agreement: the MAX all-reduce on the gloo side group at every step boundary, its mean time per step
  and its share of the run's time, as the worker measures it (its `stop:` line).

Run from the repo root: .venv/bin/python -m bench.bench_stop
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from entrypoint import selftest as names  # the log patterns: LOSS_LINE, COLOUR

REPO = Path(__file__).resolve().parent.parent
ANSI = re.compile(names.COLOUR)
STEP = re.compile(r"step:\s*(\d+)\s")
STOP = re.compile(r"stop: SIGTERM at step (\d+): saved step-\d+ \(([\d.]+) s; ([\d.]+) s since the signal; (.*)\); "
                  r"exiting 143")
SIGNAL_AFTER, STEPS = 4, 20


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, VARIANT="native", SCALE="smoke", NPROC="2", STEPS=str(STEPS), PREFLIGHT="warn",
                   OUTPUT_DIR=f"{tmp}/out", CHECKPOINT_DIR=f"{tmp}/checkpoint", CACHE_DIR=f"{tmp}/cache",
                   PYTHONUNBUFFERED="1")
        launcher = subprocess.Popen([sys.executable, "-m", "entrypoint"], cwd=REPO, env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        output, signalled = [], None
        for line in launcher.stdout:
            output.append(ANSI.sub("", line))
            step = STEP.search(output[-1])
            if signalled is None and step and int(step[1]) == SIGNAL_AFTER:
                launcher.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
        status = launcher.wait()
        took = time.monotonic() - signalled
    stop = STOP.search("".join(output))
    if status != 143 or not stop:
        print("".join(output[-40:]))
        print(f"status {status}: no save on stop found")
        return 1
    save, in_worker = float(stop[2]), float(stop[3])
    print(f"SIGTERM after step {SIGNAL_AFTER} -> saved step-{stop[1]} -> launcher exit 143: {took:.2f} s "
          f"(in-flight step {in_worker - save:.2f} s, save {save:.2f} s, exits {took - in_worker:.2f} s)")
    print(f"stop agreement, same run: {stop[4]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
