"""Run the planned command as PID 1's child, pass every stop signal on to all of its processes, bound the stop.

torchrun starts each worker in a session of its own, so every process group under the child is signalled; once
STOP_GRACE has passed since the first SIGTERM, SIGINT or SIGHUP they are SIGKILLed. After a stop a failed child
reads 128 + N (143), so a scheduler sees a stopped job (docs/production.md, "Checkpoints and preemption").
SIGUSR1/2 are ignored: neither torchrun nor torchtitan handles them, they killed every worker without a save.
On every node but 0, `host_watch` ends a run whose node 0 vanished without a word: torchrun's agent then hangs in
a call to node 0's TCPStore although its workers' collectives time out (seen: 384 s and counting, torch 2.14).
"""

import os
import signal
import socket
import subprocess
import threading
import time
from contextlib import suppress

STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # forwarded to every process group of the child
IGNORED = (signal.SIGUSR1, signal.SIGUSR2)
POLL = 0.1  # seconds between looks at the child
AFTER_KILL = 5  # seconds to wait for the groups to vanish after SIGKILL before giving up on stragglers
PROBE = 5  # seconds between connection attempts to the rendezvous host, each given as long to answer


stopped = None  # the first stop signal this process received; once set, nothing more is started


def _say(text):
    os.write(2, f"entrypoint: {text}\n".encode())  # safe inside a signal handler, unlike print


def _note_stop(signum, _frame):
    global stopped
    if stopped is None:
        stopped = signum
        _say(f"{signal.Signals(signum).name}: stopping before the launch: nothing more is started")


def _ignore(signum, _frame):
    _say(f"{signal.Signals(signum).name} ignored: only SIGTERM, SIGINT and SIGHUP stop the job (with a save)")


def watch():
    """Note stop signals from now on (the top of main), so one that comes before the launch starts nothing."""
    for signum in STOPS:
        signal.signal(signum, _note_stop)
    for signum in IGNORED:
        signal.signal(signum, _ignore)


def stop_status() -> int | None:
    """128 + the stop signal's number once one was received, else None."""
    return 128 + stopped if stopped else None


def process_table() -> dict:
    """{pid: (parent pid, process group, state)} of every process (Linux: the image's and CI's only platform)."""
    table = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                state, ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]  # after "pid (comm)"
        except (OSError, ValueError):
            continue  # gone meanwhile
        table[int(name)] = (int(ppid), int(pgrp), state)
    return table


def descendants(root_pid, table=None) -> list:
    """The pids of every process below `root_pid`, from one look at /proc (or `table`)."""
    table = process_table() if table is None else table
    children = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], [root_pid]
    while stack:
        below = children.get(stack.pop(), [])
        found += below
        stack += below
    return found


def process_groups(root_pid) -> set:
    """The process group of `root_pid` and of every process below it."""
    table = process_table()
    return {root_pid} | {table[pid][1] for pid in descendants(root_pid, table)}


def _signal_groups(groups, signum):
    for pgid in groups:
        with suppress(ProcessLookupError, PermissionError):  # gone, or (pgid reused) not ours
            os.killpg(pgid, signum)


def _any_alive(groups) -> bool:
    """Whether a process of `groups` still runs; zombies waiting for their reaper do not count."""
    return any(pgrp in groups and state != "Z" for _, pgrp, state in process_table().values())


def _reap(child) -> int | None:
    """The child's return code once it has exited (None before); as PID 1, reap every other exited process too."""
    if os.getpid() != 1:
        return child.poll()
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return child.returncode
        if pid == 0:
            return child.returncode
        if pid == child.pid:
            child.returncode = os.waitstatus_to_exitcode(status)


def host_watch(endpoint, timeout, done):
    """A callable: a line once `endpoint`, which answered before (refusing counts), is silent for `timeout` s, else
    False; a host never heard is torchrun's to judge (RDZV_TIMEOUT). Probes until `done` is set."""
    host, _, port = endpoint.rpartition(":")
    answered = []

    def probe():
        while not done.is_set():
            with suppress(OSError):  # unreachable or timed out: no answer
                with suppress(ConnectionRefusedError):  # refused: the host answered
                    socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE).close()
                answered[:] = [time.monotonic()]
            done.wait(PROBE)

    threading.Thread(target=probe, name="rendezvous-host-watch", daemon=True).start()
    return lambda: (
        bool(answered)
        and time.monotonic() - answered[0] >= timeout
        and (f"the rendezvous host {endpoint} has not answered for {timeout} s (PEER_TIMEOUT): node 0 is lost")
    )


def run(argv, env, grace, peer=None) -> int:
    """Run `argv` to its end or to the stop bound; 128 + N without starting it if stop signal N came before.
    `peer`: (the rendezvous endpoint, PEER_TIMEOUT) on every node but 0; once node 0 is lost, everything is killed
    at once (nothing can be saved without its ranks) and the status is torchrun's, 137."""
    if stopped:
        return stop_status()
    done = threading.Event()
    lost = host_watch(*peer, done) if peer else None
    child = None
    early = []  # signals that arrived before the child existed
    deadline = None  # set by the first stop signal
    groups = set()  # every process group seen under the child since the stop began

    def forward(signum, _frame):
        nonlocal deadline
        global stopped
        if signum in IGNORED:
            return _ignore(signum, _frame)
        if deadline is None:
            stopped = stopped or signum
            deadline = time.monotonic() + grace
            _say(f"{signal.Signals(signum).name}: stopping; whatever still runs in {grace} s is killed")
        if child is None:
            early.append(signum)
            return
        found = process_groups(child.pid)
        if deadline is not None:
            groups.update(found)
        _signal_groups(found, signum)

    previous = {signum: signal.signal(signum, forward) for signum in STOPS + IGNORED}
    try:
        child = subprocess.Popen(argv, env=env, start_new_session=True)
        for signum in early:
            forward(signum, None)
        code, killed_at = None, None
        while True:
            if code is None:
                code = _reap(child)
            if code is not None and (deadline is None or not _any_alive(groups)):
                break  # done; after a stop, only once nothing that was signalled is left
            now = time.monotonic()
            why = lost and deadline is None and lost()
            if why:
                deadline = now
            if deadline is not None and now >= deadline and killed_at is None:
                groups.update(process_groups(child.pid))
                _say(
                    f"{why or f'still running {grace} s after the stop signal'}: killing process groups "
                    f"{', '.join(map(str, sorted(groups)))}"
                )
                _signal_groups(groups, signal.SIGKILL)
                killed_at = now
            if killed_at is not None and code is not None and now - killed_at > AFTER_KILL:
                break
            time.sleep(POLL)
    finally:
        done.set()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    status = 128 - code if code < 0 else code
    return stop_status() if stopped and status else status
