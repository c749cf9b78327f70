"""Run the planned command as PID 1's child and pass every stop signal on to all of its processes.

The child gets its own process group, so `docker stop` (SIGTERM) or Ctrl-C reaches torchrun and every worker
at once instead of only torchrun; the launcher exits with the child's status (128 + N if killed by signal N).
"""

import os
import signal
import subprocess

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def run(argv, env) -> int:
    child = None
    early = []  # signals that arrived before the child existed

    def forward(signum, _frame):
        if child is None:
            early.append(signum)
            return
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:  # the group is already gone
            pass

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    try:
        child = subprocess.Popen(argv, env=env, start_new_session=True)
        for signum in early:
            forward(signum, None)
        code = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - code if code < 0 else code
