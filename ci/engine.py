"""A Docker engine for the image job: the one that answers, or our own, started here and stopped after.

    with Engine() as client:   # a docker.DockerClient
        client.images.list()

Order: $DOCKER_HOST / the default socket if an engine answers there; else our own socket if an
engine of ours is still up (started by another run of this job, left alone); else install Debian's
docker.io when dockerd is missing (as root, like CI), start dockerd with its own data root, exec
root and socket under NQ_DOCKER_ROOT, and stop it again on exit. Only what this object started is
stopped. Building images needs no daemon flags; `--ulimit memlock=-1` is refused on these hosts.
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker

ROOT = Path(os.environ.get("NQ_DOCKER_ROOT", "/var/lib/neuron-qwen3-ci"))
API_VERSION = "1.41"  # Debian 12's dockerd 20.10; newer engines accept it too


class EngineError(RuntimeError):
    """No engine can be had: the message says why and what to do."""


def log(message):
    print(f"[engine] {message}", file=sys.stderr, flush=True)


def _answering(base_url):
    try:
        client = docker.DockerClient(base_url=base_url, version=API_VERSION, timeout=600)
        client.ping()
        return client
    except Exception:  # no socket, refused, not a docker engine: try the next one
        return None


def apt_install(package, command):
    """`apt-get update` + install Debian's `package` unless `command` is on PATH (CI is root on Debian)."""
    if shutil.which(command):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise EngineError(
            f"{command} is missing and this job can install it only as root with apt-get: apt-get install {package}"
        )
    log(f"{command} not found: apt-get install {package}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends", package]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode:
            output = done.stdout[-2000:] + done.stderr[-2000:]
            raise EngineError(f"{' '.join(argv)} failed ({done.returncode}):\n{output}")
    if not shutil.which(command):
        raise EngineError(f"apt-get installed {package} but {command} is still not on PATH")


def _ensure_dockerd():
    apt_install("docker.io", "dockerd")


class Engine:
    def __init__(self, root=ROOT):
        self.root = Path(root)
        self.socket = self.root / "docker.sock"
        self.process = None  # the dockerd we started, if any
        self.client = None
        self.url = None

    def __enter__(self):
        candidates = [os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock", f"unix://{self.socket}"]
        for url in candidates:
            self.client = _answering(url)
            if self.client:
                self.url = url
                log(f"using the engine at {url}")
                return self.client
        self._start()
        return self.client

    def _start(self):
        _ensure_dockerd()
        self.root.mkdir(parents=True, exist_ok=True)
        pidfile = self.root / "docker.pid"
        if pidfile.exists():  # a dockerd of ours that died without cleaning up; it would refuse to start
            pidfile.unlink()
        logfile = open(self.root / "dockerd.log", "ab")
        argv = [
            "dockerd",
            "--data-root",
            str(self.root / "data"),
            "--exec-root",
            str(self.root / "exec"),
            "--host",
            f"unix://{self.socket}",
            "--pidfile",
            str(pidfile),
        ]
        log(f"starting {' '.join(argv)}")
        self.process = subprocess.Popen(argv, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EngineError(
                    f"dockerd exited with status {self.process.returncode}; its log: {self.root / 'dockerd.log'}"
                )
            self.client = _answering(f"unix://{self.socket}")
            if self.client:
                self.url = f"unix://{self.socket}"
                log(f"dockerd {self.client.version()['Version']} ready (pid {self.process.pid})")
                return
            time.sleep(0.2)
        self.stop()
        raise EngineError(f"dockerd did not answer within 60 s; its log: {self.root / 'dockerd.log'}")

    def stop(self):
        if self.process is None or self.process.poll() is not None:
            return
        log(f"stopping the dockerd this job started (pid {self.process.pid})")
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __exit__(self, *exc):
        if self.client is not None:
            self.client.close()
        self.stop()


def _stop_on_signal(signum, _frame):
    raise SystemExit(128 + signum)


if __name__ == "__main__":  # `python -m ci.engine`: an engine for manual use, up until SIGINT or SIGTERM
    for stop_signal in (signal.SIGINT, signal.SIGTERM):  # also when started in the background (SIGINT ignored)
        signal.signal(stop_signal, _stop_on_signal)
    engine = Engine()
    with engine:
        print(f"export DOCKER_HOST={engine.url}", flush=True)
        while True:
            signal.pause()
