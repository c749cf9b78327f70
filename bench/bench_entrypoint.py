"""How long the launcher takes to decide what to run, compared with starting Python at all.

The launcher is PID 1 of the container, so its cost is paid on every start; the goal is a median
`python -m entrypoint --dry-run` under 0.15 s. The bare interpreter is measured interleaved in the same run so a
busy machine slows both alike. Each measurement is one function returning named figures; add more to MEASUREMENTS.

Run from the repo root: .venv/bin/python bench/bench_entrypoint.py [runs]
"""

import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DRY_RUN_GOAL_S = 0.15


def wall(argv) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def dry_run(runs: int) -> dict:
    bare, launcher = [], []
    for _ in range(runs):
        bare.append(wall([sys.executable, "-c", "pass"]))
        launcher.append(wall([sys.executable, "-m", "entrypoint", "--dry-run"]))
    median, baseline = statistics.median(launcher), statistics.median(bare)
    return {"dry_run_median_s": median, "python_median_s": baseline, "ratio": median / baseline,
            "goal_met": median < DRY_RUN_GOAL_S}


MEASUREMENTS = [dry_run]


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    met = True
    for measure in MEASUREMENTS:
        figures = measure(runs)
        met &= figures.get("goal_met", True)
        shown = [f"{name} {value:.3f}" if isinstance(value, float) else f"{name} {value}"
                 for name, value in figures.items()]
        print(f"{measure.__name__} ({runs} runs): " + ", ".join(shown))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
