"""The stop bound: after SIGTERM, whatever the launcher started is gone within STOP_GRACE seconds.

The children here are shaped like torchrun's: an agent whose workers run in sessions of their own, so that
signalling the agent's process group alone would miss them.
Run: .venv/bin/python -m pytest tests/test_entrypoint_launch.py -q
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from entrypoint import launch

REPO = Path(__file__).resolve().parent.parent
GRACE = 2

AGENT = """
import os, signal, subprocess, sys, time
out, agent_on_term, worker_on_term = sys.argv[1], sys.argv[2], sys.argv[3]
WORKER = '''
import os, signal, sys, time
if sys.argv[2] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(sys.argv[1], "worker.pid"), "w").write(str(os.getpid()))
while True:
    time.sleep(0.1)
'''
worker = subprocess.Popen([sys.executable, "-c", WORKER, out, worker_on_term], start_new_session=True)
if agent_on_term == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    # "exit": like torchrun's SignalException, without waiting; "done": a run that had just finished
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1 if agent_on_term == "exit" else 0))
while not os.path.exists(os.path.join(out, "worker.pid")):
    time.sleep(0.01)
open(os.path.join(out, "agent.pid"), "w").write(str(os.getpid()))
while True:
    time.sleep(0.1)
"""


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def start(tmp_path, agent_on_term, worker_on_term):
    code = "import sys; from entrypoint.launch import run; sys.exit(run(sys.argv[2:], None, int(sys.argv[1])))"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            str(GRACE),
            sys.executable,
            "-c",
            AGENT,
            str(tmp_path),
            agent_on_term,
            worker_on_term,
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    agent, worker = wait_for_agent(tmp_path, launcher)
    return launcher, agent, worker


def wait_for_agent(tmp_path, launcher) -> tuple[int, int]:
    """The agent's and worker's pids once both pid files are written (not just created); fails if it never starts."""
    deadline = time.monotonic() + 30
    pids = (tmp_path / "agent.pid", tmp_path / "worker.pid")
    while not all(path.exists() and path.read_text().strip() for path in pids):
        if time.monotonic() > deadline or launcher.poll() is not None:
            launcher.kill()
            pytest.fail("the agent never started")
        time.sleep(0.02)
    return tuple(int(path.read_text()) for path in pids)


def kill(*pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize(
    "agent_on_term, worker_on_term, status, killed",
    [
        ("exit", "default", 143, False),  # everything stops on SIGTERM: no kill needed; torchrun's 1 reads as a stop
        ("exit", "ignore", 143, True),  # torchrun gone, a worker hangs on: killed at the deadline
        ("ignore", "ignore", 143, True),
    ],
)  # nothing stops: all killed at the deadline
def test_sigterm_stops_everything_within_the_grace(tmp_path, agent_on_term, worker_on_term, status, killed):
    launcher, agent, worker = start(tmp_path, agent_on_term, worker_on_term)
    try:
        assert os.getpgid(worker) != os.getpgid(agent)  # the worker is out of the agent's process group
        started = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=GRACE + 10) == status
        took = time.monotonic() - started
        err = launcher.stderr.read()
        assert not alive(agent) and not alive(worker), err
        assert took < GRACE + 1.5, f"stopped in {took:.1f}s, bound {GRACE}s + 1.5s"
        assert ("killing process groups" in err) is killed, err
        if not killed:
            assert took < GRACE, f"nothing needed killing but the stop took {took:.1f}s"
    finally:  # on a failure, leave nothing behind
        kill(launcher.pid, agent, worker)


def test_process_groups_reach_workers_in_their_own_sessions(tmp_path):
    launcher, agent, worker = start(tmp_path, "exit", "default")
    try:
        groups = launch.process_groups(launcher.pid)
        assert {os.getpgid(agent), os.getpgid(worker)} <= groups
        assert os.getpgid(0) not in groups  # never the test's own group
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=GRACE + 10)


def test_a_normal_exit_returns_at_once():
    started = time.monotonic()
    assert launch.run([sys.executable, "-c", "import sys; sys.exit(4)"], None, grace=30) == 4
    assert time.monotonic() - started < 5


def pid_namespace_available():
    try:
        return (
            subprocess.run(
                ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=20
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


def watched(monkeypatch, outcomes, timeout):
    """host_watch of a stand-in connect that meets each outcome in turn, the last one for ever (None: connected)."""
    monkeypatch.setattr(launch, "PROBE", 0.02)
    calls = iter(outcomes)

    def connect(address, timeout):
        outcome = next(calls, outcomes[-1])
        if outcome:
            raise outcome
        return socket.socket()

    monkeypatch.setattr(launch.socket, "create_connection", connect)
    done = threading.Event()
    return launch.host_watch("trn-001:29500", timeout, done), done


def test_a_host_that_answered_and_falls_silent_is_lost_after_peer_timeout(monkeypatch):
    lost, done = watched(monkeypatch, [None, TimeoutError(), OSError(113, "No route to host")], 0.5)
    try:
        began = time.monotonic()
        while not lost() and time.monotonic() - began < 10:
            time.sleep(0.01)
        took = time.monotonic() - began
    finally:
        done.set()
    assert lost() == "the rendezvous host trn-001:29500 has not answered for 0.5 s (PEER_TIMEOUT): node 0 is lost"
    assert 0.45 <= took < 2, took


@pytest.mark.parametrize("outcome", [ConnectionRefusedError(), socket.gaierror(-2, "Name or service not known")])
def test_a_refusing_host_is_up_and_a_host_never_seen_is_torchruns_to_judge(monkeypatch, outcome):
    """Refused: the host is up, its store between two attempts. Never answered: RDZV_TIMEOUT decides."""
    lost, done = watched(monkeypatch, [outcome], 0.2)
    time.sleep(0.6)
    done.set()
    assert lost() is False


def test_the_watch_reaches_a_real_listener():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        done = threading.Event()
        lost = launch.host_watch(f"127.0.0.1:{server.getsockname()[1]}", 0, done)
        began = time.monotonic()
        while not lost() and time.monotonic() - began < 10:  # timeout 0: lost as soon as it has answered once
            time.sleep(0.01)
        done.set()
    assert lost(), "the listener never answered"


LOST = """import os, socket, sys
from entrypoint.launch import run
ready = os.path.join(sys.argv[1], "worker.pid")
def connect(address, timeout):  # node 0 answers until the worker runs, then is silent
    if os.path.exists(ready):
        raise TimeoutError
    return socket.socket()
socket.create_connection = connect
sys.exit(run(sys.argv[2:], None, 60, ("trn-001:29500", 1)))
"""


def test_a_lost_node_0_kills_everything_at_once(tmp_path):
    """No grace (no save can succeed without node 0's ranks), even for processes that ignore SIGTERM, as torchrun
    stuck in a TCPStore call does; the status is torchrun's, killed by SIGKILL."""
    launcher = subprocess.Popen(
        [sys.executable, "-c", LOST, str(tmp_path), sys.executable, "-c", AGENT, str(tmp_path), "ignore", "ignore"],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        began = time.monotonic()
        status = launcher.wait(timeout=60)
        took = time.monotonic() - began
        stderr = launcher.stderr.read()
        assert (
            status == 137
            and "entrypoint: the rendezvous host trn-001:29500 has not answered for 1 s "
            "(PEER_TIMEOUT): node 0 is lost: killing process groups"
            in stderr
        ), stderr
        assert took < 20, f"{took:.1f} s: the 60 s grace was waited"
        assert not alive(int((tmp_path / "worker.pid").read_text()))
    finally:
        launcher.kill()


@pytest.mark.skipif(not pid_namespace_available(), reason="needs `unshare --pid` (root or user namespaces)")
@pytest.mark.parametrize("agent_on_term, worker_on_term, status", [("done", "ignore", 0), ("exit", "default", 143)])
def test_as_pid_1_the_child_status_survives_reaping_orphans(tmp_path, agent_on_term, worker_on_term, status):
    """In a container the launcher is PID 1: orphaned workers become its children, and it reaps them all."""
    code = (
        "import os, sys; from entrypoint.launch import run; assert os.getpid() == 1; "
        "sys.exit(run(sys.argv[2:], None, int(sys.argv[1])))"
    )
    launcher = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            sys.executable,
            "-c",
            code,
            str(GRACE),
            sys.executable,
            "-c",
            AGENT,
            str(tmp_path),
            agent_on_term,
            worker_on_term,
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    pid_1 = None
    try:
        wait_for_agent(tmp_path, launcher)
        table = launch.process_table()
        pid_1 = next(pid for pid, (ppid, _, _) in table.items() if ppid == launcher.pid)  # seen from outside
        started = time.monotonic()
        os.kill(pid_1, signal.SIGTERM)  # unshare does not pass signals on
        assert launcher.wait(timeout=GRACE + 10) == status, launcher.stderr.read()
        assert time.monotonic() - started < GRACE + 1.5
    finally:  # killing PID 1 of the namespace ends every process in it
        kill(*[pid for pid in (pid_1, launcher.pid) if pid])


def test_a_stop_before_the_launch_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "stopped", signal.SIGTERM)
    marker = tmp_path / "started"
    assert launch.run([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], None, grace=5) == 143
    assert not marker.exists()


RECORDER = """
import os, signal, sys, time
out = sys.argv[1]
def note(signum, frame):
    with open(os.path.join(out, "signals"), "a") as f:
        f.write(signal.Signals(signum).name + "\\n")
    if signum == signal.SIGTERM:
        sys.exit(0)
for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(signum, note)
open(os.path.join(out, "ready"), "w").close()
while True:
    time.sleep(0.05)
"""


def test_sigusr1_and_sigusr2_are_not_forwarded(tmp_path):
    code = "import sys; from entrypoint.launch import run; sys.exit(run(sys.argv[1:], None, 5))"
    launcher = subprocess.Popen(
        [sys.executable, "-c", code, sys.executable, "-c", RECORDER, str(tmp_path)],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < deadline and launcher.poll() is None, "the child never got ready"
            time.sleep(0.01)
        for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):  # handled in this order by the launcher
            launcher.send_signal(signum)
            time.sleep(0.05)  # separate deliveries (same-numbered pending signals would merge)
        assert launcher.wait(timeout=10) == 0  # the child finished cleanly after its SIGTERM
        assert (tmp_path / "signals").read_text().split() == ["SIGTERM"]
        assert "SIGUSR1 ignored" in launcher.stderr.read()
    finally:
        launcher.kill()
