"""A two-node Slurm cluster on one host, for tests/test_slurm_nodes.py: three network namespaces of its own.

    nq23-<pid>-ctl  slurmctld, host name `nq23ctl`, 10.231.0.1 on a bridge `br0` that links the nodes
    nq23-<pid>-n1   slurmd -N nq23n1, host name `nq23n1`, 10.231.0.11 (eth0, a veth to the bridge)
    nq23-<pid>-n2   slurmd -N nq23n2, host name `nq23n2`, 10.231.0.12

Every daemon runs under `nsenter --net=/run/netns/<ns> unshare --uts --mount`: its own host name (so torchrun, gloo and
slurmd see a node's name, which resolves to the node's address) and an /etc/hosts of the cluster bind-mounted over
the real one in its own mount namespace (the host's /etc is never written). Nothing is added to the host's network
namespace: the bridge lives in the controller's, and only 10.231.0.0/24 inside these namespaces and loopback are
used. munged runs on the host with a key and socket of its own (AuthInfo=socket=...): a socket file, which every
network namespace reaches. Everything is stopped by pid (daemons by their pid files, job processes as the
namespaces' own pids) and the namespaces are deleted, also when a test fails.
"""

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

NET = "10.231.0"
CTL = ("nq23ctl", f"{NET}.1")
NODES = {"nq23n1": f"{NET}.11", "nq23n2": f"{NET}.12"}
SLURMD_TIMEOUT = 20  # seconds without an answer before slurmctld sets a node DOWN (and requeues its jobs)
CONF = """ClusterName=nq23
SlurmctldHost={ctl}({ctl_addr})
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=socket={tmp}/munge/munge.sock,cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog={tmp}/task_prolog.sh
SlurmUser=root
SlurmdUser=root
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool/%n
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd.%n.pid
SlurmctldLogFile={tmp}/slurmctld.log
SlurmdLogFile={tmp}/slurmd.%n.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout={slurmd_timeout}
KillWait=90
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
# Run by slurmstepd before each task, with the job's environment: what it prints as `export NAME=value` is added
# to the task's. A job submitted with NQ23_NODE2_ENV=NAME=value gets that setting on nq23n2 only: a node started
# with a setting the other lacks, within one Slurm job (tests/test_slurm_nodes.py, mismatched nodes).
TASK_PROLOG = """#!/bin/sh
if [ "$SLURMD_NODENAME" = nq23n2 ] && [ -n "$NQ23_NODE2_ENV" ]; then echo "export $NQ23_NODE2_ENV"; fi
"""


def sh(*argv, env=None, check=True, timeout=120):
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=check)


def install_slurm():
    """None when slurm-wlm and munge are there (installed now if needed), else why not."""
    if os.geteuid() != 0:
        return "needs root to install and run slurmctld, slurmd and munged"
    if shutil.which("sbatch") and shutil.which("munged") or os.path.exists("/usr/sbin/munged"):
        return None
    if not shutil.which("apt-get"):
        return "slurm-wlm is not installed and there is no apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "slurm-wlm", "munge"],
    ):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode:
            return f"`{' '.join(argv)}` failed: {done.stderr.strip().splitlines()[-1:]}"
    return None


def read_pid(pidfile, timeout=30) -> int:
    """The daemon's pid once its pid file holds one (the file exists, empty, for a moment before)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return int(Path(pidfile).read_text())
        except (FileNotFoundError, ValueError):
            assert time.monotonic() < deadline, f"{pidfile} holds no pid after {timeout} s"
            time.sleep(0.2)


def alive(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_daemon(pid, timeout=20):
    """SIGTERM, then SIGKILL: a slurmctld whose munged or slurmd went first can hang in its shutdown, keep its
    port, and make the next start of a test fail to bind."""
    for signum, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5)):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.2)
        if not alive(pid):
            return


def namespaces_possible() -> str | None:
    """None where this process can make network namespaces, else why not (for the skip)."""
    if os.geteuid() != 0:
        return "needs root to make network namespaces and run slurmctld, slurmd and munged"
    for tool in ("ip", "nsenter", "unshare"):
        if not shutil.which(tool):
            return f"no `{tool}` (iproute2, util-linux) to make network namespaces"
    probe = f"nq23-{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"network namespaces cannot be made here: `ip netns add` says {made.stderr.strip()!r}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class Cluster:
    """Start with `start()`, always end with `stop()`; Slurm's commands run through `slurm(...)`."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.tag = f"nq23-{os.getpid()}"
        self.ns = {"ctl": f"{self.tag}-ctl", **{name: f"{self.tag}-{name[-2:]}" for name in NODES}}
        self.made = []  # namespaces made, deleted by stop()
        self.daemons = {}  # name -> pid
        self.munged = None
        self.env = {**os.environ, "SLURM_CONF": str(tmp / "slurm.conf")}

    # ---- the network
    def _ip(self, ns, *args):
        sh("ip", "-n", ns, *args)

    def _network(self):
        for ns in self.ns.values():
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            self._ip(ns, "link", "set", "lo", "up")
        ctl = self.ns["ctl"]
        self._ip(ctl, "link", "add", "br0", "type", "bridge")
        self._ip(ctl, "addr", "add", f"{CTL[1]}/24", "dev", "br0")
        self._ip(ctl, "link", "set", "br0", "up")
        for name, addr in NODES.items():
            node, port = self.ns[name], f"v{name[-1]}"
            self._ip(ctl, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", node)
            self._ip(ctl, "link", "set", port, "master", "br0", "up")
            self._ip(node, "addr", "add", f"{addr}/24", "dev", "eth0")
            self._ip(node, "link", "set", "eth0", "up")
        hosts = ["127.0.0.1 localhost", f"{CTL[1]} {CTL[0]}"] + [f"{addr} {name}" for name, addr in NODES.items()]
        (self.tmp / "hosts").write_text("\n".join(hosts) + "\n")

    def inside(self, where: str, *argv) -> list:
        """argv run in `where`'s namespaces ("ctl" or a node name), under that host name and the cluster's hosts."""
        host = CTL[0] if where == "ctl" else where
        return [
            "nsenter",
            f"--net=/run/netns/{self.ns[where]}",
            "unshare",
            "--uts",
            "--mount",
            "sh",
            "-c",
            f'mount --bind {self.tmp}/hosts /etc/hosts && hostname {host} && exec "$@"',
            "sh",
            *argv,
        ]

    def link(self, node: str, up: bool):
        """The node's cable: down, its packets go nowhere (a node that vanished sends no FIN, no RST)."""
        self._ip(self.ns[node], "link", "set", "eth0", "up" if up else "down")

    # ---- the daemons
    def _munge(self):
        folder = self.tmp / "munge"
        folder.mkdir()
        sh("mungekey", "-c", "-k", str(folder / "munge.key"))
        sh(
            "/usr/sbin/munged",
            "--force",
            f"--socket={folder}/munge.sock",
            f"--key-file={folder}/munge.key",
            f"--pid-file={folder}/munged.pid",
            f"--log-file={folder}/munged.log",
            f"--seed-file={folder}/seed",
        )
        self.munged = read_pid(folder / "munged.pid")

    def start_slurmd(self, node: str):
        pidfile = self.tmp / f"slurmd.{node}.pid"
        pidfile.unlink(missing_ok=True)
        sh(*self.inside(node, "/usr/sbin/slurmd", "-N", node), env=self.env)
        self.daemons[node] = read_pid(pidfile)

    def start(self, slurmd_timeout=SLURMD_TIMEOUT):
        for sub in ("state", "spool/nq23n1", "spool/nq23n2"):
            (self.tmp / sub).mkdir(parents=True)
        nodes = "\n".join(
            f"NodeName={name} NodeAddr={addr} CPUs={os.cpu_count()} State=UNKNOWN" for name, addr in NODES.items()
        )
        (self.tmp / "slurm.conf").write_text(
            CONF.format(ctl=CTL[0], ctl_addr=CTL[1], tmp=self.tmp, nodes=nodes, slurmd_timeout=slurmd_timeout)
        )
        (self.tmp / "task_prolog.sh").write_text(TASK_PROLOG)
        (self.tmp / "task_prolog.sh").chmod(0o755)
        self._network()
        self._munge()
        sh(*self.inside("ctl", "/usr/sbin/slurmctld"), env=self.env)
        self.daemons["slurmctld"] = read_pid(self.tmp / "slurmctld.pid")
        for node in NODES:
            self.start_slurmd(node)
        self.wait_idle()

    def wait_idle(self, nodes=tuple(NODES), timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            shown = self.slurm("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
            states = dict(zip(shown[::2], shown[1::2]))
            if all(states.get(node) == "idle" for node in nodes):
                return
            # installed and started, yet unusable: a failure of this setup, not a missing Slurm
            assert time.monotonic() < deadline, f"nodes not idle after {timeout} s: {states}" + self.logs()
            time.sleep(0.5)

    def slurm(self, *argv, env=None, check=True, timeout=60):
        """A Slurm command (sbatch, scontrol, ...) run on the controller's network, as a login node would."""
        return sh(*self.inside("ctl", *argv), env=env or self.env, check=check, timeout=timeout)

    def pids(self, where: str) -> list:
        """Every process in `where`'s network namespace: the daemon and whatever the jobs started there."""
        listed = subprocess.run(["ip", "netns", "pids", self.ns[where]], capture_output=True, text=True)
        return [int(pid) for pid in listed.stdout.split()]

    def end_jobs(self):
        """SIGKILL every process of the nodes but their slurmd: what a failed test's jobs left running."""
        for node in NODES:
            if self.ns[node] in self.made:
                for pid in set(self.pids(node)) - set(self.daemons.values()):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    def lose(self, node: str) -> int:
        """The node vanishes mid-run: cable out, then SIGKILL to slurmd and every job process there. Returns how
        many processes were killed."""
        self.link(node, up=False)
        killed = 0
        for _ in range(5):  # a fork that was under way reappears once: until nothing is left
            pids = self.pids(node)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            if not pids:
                break
            time.sleep(0.2)
        self.daemons.pop(node, None)
        return killed

    def revive(self, node: str):
        """The node is back: cable in, slurmd started again (ReturnToService=2 brings it back into service)."""
        self.link(node, up=True)
        self.start_slurmd(node)

    def logs(self) -> str:
        names = ["slurmctld.log"] + [f"slurmd.{node}.log" for node in NODES]
        return "".join(
            f"\n--- {name} (tail)\n" + (self.tmp / name).read_text()[-2500:]
            for name in names
            if (self.tmp / name).exists()
        )

    def stop(self):
        """Job processes first (by the namespaces' pids), then the daemons by pid, munged last, then the
        namespaces, which takes their links and the bridge with them."""
        self.end_jobs()
        for name in [*NODES, "slurmctld"]:
            if name in self.daemons:
                stop_daemon(self.daemons.pop(name))
        if self.munged:
            stop_daemon(self.munged)
        for ns in reversed(self.made):
            for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made.clear()


def job_state(cluster, job) -> tuple:
    shown = cluster.slurm("scontrol", "show", "job", job, check=False).stdout
    state = re.search(r"JobState=(\S+)", shown)
    restarts = re.search(r"Restarts=(\d+)", shown)
    return (state[1] if state else "GONE"), int(restarts[1]) if restarts else 0
