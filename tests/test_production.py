"""Production launch: two nodes on one machine, and a worker killed with restarts allowed.

Real torchrun runs of the native smoke config through `python -m entrypoint` on CPU (gloo), a few tens of seconds
each. A stop (SIGTERM) and a damaged checkpoint are tests/test_save_on_stop.py's; the deploy files are
tests/test_deploy.py's. Run:
    .venv/bin/python -m pytest tests/test_production.py
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import ANSI, REPO, STEP_LOSS

from entrypoint import launch


# ---- training through the launcher -------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One compile cache for the module: inductor kernels compiled by the first run are reused by the others."""
    return tmp_path_factory.mktemp("cache")


def launcher_env(tmp, cache, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_"))}
    return {
        **base,
        "VARIANT": "native",
        "SCALE": "smoke",
        "NPROC": "1",
        "OUTPUT_DIR": str(tmp / "out"),
        "CACHE_DIR": str(cache),
        **env,
    }


def start(log, env):
    return subprocess.Popen(
        [sys.executable, "-m", "entrypoint"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def losses(text):
    return [(int(step), float(loss)) for step, loss in STEP_LOSS.findall(ANSI.sub("", text))]


def wait_for(path, process, timeout=300):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"the launcher exited ({process.returncode}) before {path} appeared"
        assert time.monotonic() < deadline, f"no {path} after {timeout}s"
        time.sleep(0.05)


def cleanup(process):
    """On a failure, leave nothing behind: the launcher and every process group below it."""
    for pgid in launch.process_groups(process.pid) | {process.pid}:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    process.wait()


@pytest.mark.training
def test_two_nodes_on_one_machine_train_together(tmp_path, cache):
    port = str(free_port())
    runs = []
    for rank in (0, 1):
        env = launcher_env(
            tmp_path / f"node{rank}",
            cache,
            NNODES="2",
            NODE_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            STEPS="4",
        )
        log = open(tmp_path / f"node{rank}.log", "w")
        runs.append((start(log, env), log))
    try:
        codes = [process.wait(timeout=400) for process, _ in runs]
    finally:
        for process, _ in runs:
            cleanup(process)
    logs = [ANSI.sub("", (tmp_path / f"node{rank}.log").read_text()) for rank in (0, 1)]
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    for log in logs:
        assert "--nnodes=2" in log and f"--rdzv_endpoint 127.0.0.1:{port}" in log
        assert "dp_shard=2" in log  # one world of two ranks, one per node, not two worlds of one
    node0, node1 = losses(logs[0]), losses(logs[1])
    assert [step for step, _ in node0] == [1, 2, 3, 4] and node0 == node1  # the same global loss on both nodes
    assert node0[-1][1] < node0[0][1]


@pytest.mark.training
def test_kill_9_of_a_worker_resumes_in_place_with_restarts_allowed(tmp_path, cache):
    ckpt = tmp_path / "ckpt"
    env = launcher_env(
        tmp_path, cache, NPROC="2", STEPS="10", CHECKPOINT_DIR=str(ckpt), CHECKPOINT_INTERVAL="3", MAX_RESTARTS="1"
    )
    with open(tmp_path / "run.log", "w") as log:
        process = start(log, env)
        try:
            wait_for(ckpt / "step-3" / ".metadata", process)
            children = {pid: ppid for pid, (ppid, _, _) in launch.process_table().items()}
            torchrun = next(pid for pid, ppid in children.items() if ppid == process.pid)
            workers = [pid for pid, ppid in children.items() if ppid == torchrun]
            assert len(workers) == 2
            os.kill(workers[-1], signal.SIGKILL)
            code = process.wait(timeout=400)
        finally:
            cleanup(process)
    log = ANSI.sub("", (tmp_path / "run.log").read_text())
    assert code == 0, log[-3000:]
    loaded = re.search(rf"Loading the checkpoint from {ckpt}/step-(\d+)\.", log)
    assert loaded and int(loaded[1]) >= 3, log[-3000:]  # the restarted workers found a checkpoint
    before, after = losses(log[: loaded.start()]), losses(log[loaded.end() :])
    assert [step for step, _ in before][:1] == [1]  # the first attempt, killed after its first checkpoint
    assert [step for step, _ in after] == list(range(int(loaded[1]) + 1, 11))  # resumed there, not at step 1
