"""One live job per CHECKPOINT_DIR: a lease file node rank 0 takes before the checkpoint housekeeping, since two
jobs on one folder would purge and overwrite each other's `step-N`. When a lease is taken over:
docs/production.md, "One job per folder". torchtitan ignores the file: no `step-N` in its name.
"""

import json
import os
import socket
import threading
import time
from contextlib import suppress

from entrypoint.contract import UsageError

NAME = ".lease"
HEARTBEAT = 10  # seconds between refreshes of the lease's modification time
STALE = 60  # seconds without a refresh after which a lease is taken over


def _holder(path) -> dict:
    try:
        with open(path) as f:
            holder = json.load(f)
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {}  # half-written or unreadable: judged by its age alone


def _taken_over(holder, me, age) -> str | None:
    """Why the lease of `holder` may be taken over by `me`, or None if its owner is live. Its pid may be this very
    process's: a restarted container is PID 1 again."""
    if age >= STALE:
        return f"its heartbeat is {age:.0f} s old"
    if me["job"] and holder.get("job") == me["job"]:
        return f"it belongs to this job ({me['job']})"
    if holder.get("host") == me["host"] and isinstance(holder.get("pid"), int):
        if holder["pid"] == me["pid"] or not os.path.exists(f"/proc/{holder['pid']}"):
            return f"its process {holder['pid']} on this host is gone"
    return None


class Lease:
    """The lease on `folder`: `take()` or refuse, a heartbeat thread, `release()`."""

    def __init__(self, folder, job: str | None, now=time.time):
        self.path = os.path.join(folder, NAME)
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "job": job}
        self.now = now
        self._stop = threading.Event()

    def take(self) -> str | None:
        """Create the lease or take over a dead one (returns why, for a warning line); UsageError if it is live."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        why = None
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = _holder(self.path)
                try:
                    age = self.now() - os.stat(self.path).st_mtime
                except FileNotFoundError:
                    continue  # released meanwhile
                why = _taken_over(holder, self.me, age)
                if why is None:
                    raise UsageError(
                        f"CHECKPOINT_DIR={os.path.dirname(self.path)} is in use by job {holder.get('job') or '-'} "
                        f"(host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, heartbeat {age:.0f} s ago): "
                        f"give this job its own CHECKPOINT_DIR, or wait until the other stops (a lease without "
                        f"heartbeat for {STALE} s is taken over)"
                    ) from None
                with suppress(FileNotFoundError):
                    os.remove(self.path)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(self.me, f)
            threading.Thread(target=self._beat, daemon=True, name="lease-heartbeat").start()
            return why and f"took over the lease {self.path}: {why}"
        raise UsageError(
            f"CHECKPOINT_DIR={os.path.dirname(self.path)}: another launcher took the lease {self.path} "
            "at the same moment"
        )

    def _beat(self):
        while not self._stop.wait(HEARTBEAT):
            try:
                os.utime(self.path)
            except OSError:
                return  # taken over or the folder is gone: the other owner's launch decides

    def release(self):
        """Stop the heartbeat and remove the lease if it is still this launcher's."""
        self._stop.set()
        if _holder(self.path) == self.me:
            with suppress(FileNotFoundError):
                os.remove(self.path)
