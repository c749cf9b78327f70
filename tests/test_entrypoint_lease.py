"""One live job per CHECKPOINT_DIR: the lease node 0 takes before touching the checkpoints.

Run: .venv/bin/python -m pytest tests/test_entrypoint_lease.py -q
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrypoint import lease
from entrypoint.contract import UsageError

REPO = Path(__file__).resolve().parent.parent


def held_by(folder, **holder):
    folder.mkdir(exist_ok=True)
    (folder / lease.NAME).write_text(json.dumps(holder))


def test_the_lease_names_its_owner_and_goes_on_release(tmp_path):
    mine = lease.Lease(str(tmp_path / "ckpt"), "job-1")
    assert mine.take() is None
    assert json.loads((tmp_path / "ckpt" / lease.NAME).read_text()) == {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "job": "job-1",
    }
    mine.release()
    assert not (tmp_path / "ckpt" / lease.NAME).exists()


def test_a_live_owner_is_refused_with_one_line(tmp_path):
    held_by(tmp_path, host="other-node", pid=1, job="job-1")
    with pytest.raises(UsageError) as refused:
        lease.Lease(str(tmp_path), "job-2").take()
    line = str(refused.value)
    assert line.startswith(f"CHECKPOINT_DIR={tmp_path} is in use by job job-1") and "\n" not in line
    assert json.loads((tmp_path / lease.NAME).read_text())["job"] == "job-1"  # untouched


@pytest.mark.parametrize(
    "holder, age, why",
    [
        (dict(host="other-node", pid=1, job="job-1"), lease.STALE + 1, "heartbeat is"),
        (dict(host="other-node", pid=1, job="job-2"), 0, "belongs to this job"),  # a requeued Slurm job
        (dict(host=socket.gethostname(), pid=os.getpid(), job=None), 0, "is gone"),  # a restarted container's PID 1
    ],
)
def test_a_dead_owner_is_taken_over(tmp_path, holder, age, why):
    held_by(tmp_path, **holder)
    mine = lease.Lease(str(tmp_path), "job-2", now=lambda: time.time() + age)
    assert why in mine.take()
    assert json.loads((tmp_path / lease.NAME).read_text())["job"] == "job-2"


def test_an_exited_process_on_this_host_is_taken_over(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    held_by(tmp_path, host=socket.gethostname(), pid=gone.pid, job=None)
    assert f"process {gone.pid} on this host is gone" in lease.Lease(str(tmp_path), None).take()


def test_release_leaves_a_lease_taken_over_by_another(tmp_path):
    mine = lease.Lease(str(tmp_path), "job-1")
    mine.take()
    held_by(tmp_path, host="other-node", pid=1, job="job-2")
    mine.release()
    assert json.loads((tmp_path / lease.NAME).read_text())["job"] == "job-2"


def test_a_second_launcher_on_a_live_checkpoint_dir_starts_nothing(tmp_path):
    held_by(tmp_path / "ckpt", host="other-node", pid=1, job="first-job")
    env = {
        "PATH": os.environ["PATH"],
        "DEVICE": "cpu",
        "SCALE": "smoke",
        "PREFLIGHT": "warn",
        "CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "OUTPUT_DIR": str(tmp_path / "out"),
        "CACHE_DIR": str(tmp_path / "cache"),
        "SLURM_JOB_ID": "second-job",
    }
    result = subprocess.run(
        [sys.executable, "-m", "entrypoint"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "torch.distributed.run" not in result.stdout
    assert (
        result.stderr.strip().splitlines()[-1].startswith(f"entrypoint: CHECKPOINT_DIR={tmp_path / 'ckpt'} is in use")
    )
