"""quirks/worker_exit.py: a worker that finished runs its atexit handlers right after torchtitan's last line and
ends, without the interpreter's finalization; any other ending still finalizes.

A sitecustomize.py put first on the workers' path registers an atexit handler that writes a file, and keeps an
object whose finalizer writes another when the interpreter tears its modules down. After a normal finish the first
is written and the second is not; after a run that stops at a failing reward (exit 2) both are.
Run: .venv/bin/python -m pytest tests/test_worker_exit.py -q
"""

import json
import logging
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import REPO, side_by_side_env
from neuron_qwen3.quirks import worker_exit

SENTINEL = """
import atexit, os


def written(name):
    open(os.path.join(os.environ["SENTINELS"], name + "-" + os.environ["LOCAL_RANK"]), "w").close()


class Finalized:
    path = os.path.join(os.environ.get("SENTINELS", ""), "finalized-" + os.environ.get("LOCAL_RANK", ""))

    def __del__(self, open=open):  # its own references: module globals are gone by then
        open(self.path, "w").close()


if os.environ.get("LOCAL_RANK") is not None:
    atexit.register(written, "atexit")
    kept = Finalized()
"""


def test_only_the_last_line_of_a_torchtitan_worker_ends_the_process():
    handler = worker_exit.ExitAfterLastLine()
    handler.emit(logging.LogRecord("root", logging.INFO, __file__, 1, "Training completed", None, None))  # no exit
    root = logging.getLogger()
    before = list(root.handlers)
    worker_exit.install()  # pytest's __main__ is not torchtitan/train.py: nothing is installed
    assert root.handlers == before


@pytest.mark.training
def test_a_finished_worker_skips_finalization_and_a_failed_one_does_not(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SENTINEL)
    (tmp_path / "data").mkdir()
    record = {"prompt": [{"role": "user", "content": "Is 4 even?"}], "answer": "Yes."}
    (tmp_path / "data" / "prompts.jsonl").write_text(json.dumps(record) + "\n")
    (tmp_path / "data" / "failing.py").write_text("def reward(completions, **kwargs):\n    return 1 / 0\n")
    runs = {
        "finished": dict(STEPS="2", NPROC="2"),
        "failed": dict(
            METHOD="grpo", DATASET=str(tmp_path / "data" / "prompts.jsonl"), GRPO_REWARDS="failing:reward", STEPS="1"
        ),
    }

    def launch(name, env):
        (tmp_path / name).mkdir()
        path = os.pathsep.join([str(tmp_path / "site"), os.environ["PYTHONPATH"]])
        out, sentinels = str(tmp_path / name / "out"), str(tmp_path / name)
        env = side_by_side_env(SCALE="smoke", OUTPUT_DIR=out, SENTINELS=sentinels, PYTHONPATH=path, **runs[name])
        return subprocess.run([sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True)

    with ThreadPoolExecutor(2) as pool:
        done = dict(zip(runs, pool.map(launch, runs, runs.values())))
    finished, failed = done["finished"], done["failed"]
    assert finished.returncode == 0, finished.stderr[-3000:]
    for rank in ("0", "1"):
        log = next((tmp_path / "finished" / "out" / "torchrun").rglob(f"attempt_0/{rank}/stdout.log")).read_text()
        assert log.rstrip().endswith(worker_exit.LAST_LINE), log[-500:]  # the line is written before the exit
    for rank in ("0", "1"):
        assert (tmp_path / "finished" / f"atexit-{rank}").exists()  # the handlers ran, teardown.py's among them
        assert not (tmp_path / "finished" / f"finalized-{rank}").exists()  # finalization did not
    assert failed.returncode != 0 and "GRPO_REWARDS: failing:reward raised ZeroDivisionError" in failed.stderr
    assert (tmp_path / "failed" / "atexit-0").exists() and (tmp_path / "failed" / "finalized-0").exists()
