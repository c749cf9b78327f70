"""A stopped run's $OUTPUT_DIR/report/ says `stopped`. Every variant's finished report, and the comparison of
them, are checked on test_training.py's runs (one run per variant serves both)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.training
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launcher_env(out, cache, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "WANDB_"))}
    return {**base, "SCALE": "smoke", "NPROC": "1", "OUTPUT_DIR": str(out), "CACHE_DIR": str(cache), **env}


def test_a_stopped_run_says_stopped(tmp_path):
    """SIGTERM to the launcher mid-run: every process stops, and the summary says `stopped`, not `failed`."""
    out = tmp_path / "out"
    env = launcher_env(out, tmp_path / "cache", VARIANT="native", STEPS="1000", STOP_GRACE="60")
    with open(tmp_path / "log", "w") as log:
        launcher = subprocess.Popen([sys.executable, "-m", "entrypoint"], cwd=REPO, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        metrics = out / "report" / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
            assert launcher.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()[-3000:]
            time.sleep(0.1)
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=120)
    summary = json.loads((out / "report" / "summary.json").read_text())
    assert summary["end"] == "stopped", summary["end_detail"]
    assert 2 <= summary["steps"]["done"] < 1000 and summary["steps"]["planned"] == 1000
    assert (out / "report" / "loss.png").exists()
