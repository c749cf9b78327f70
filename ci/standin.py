"""The stand-in base image: Debian 12 + Python 3.11 + torch 2.14.1, playing the Neuron DLC's role in CI.

    python -m ci.standin            # build it if missing; print its tag

No base image can be pulled here, so the root filesystem is made with debootstrap and imported. The
tag is keyed by the content of everything that goes into it (ci/standin/Dockerfile, the Debian
packages, requirements-torch.lock), so a run reuses the stand-in a previous run on the same engine
built, and a change in any input builds a new one (older stand-ins are removed). The 3 GB torch
wheelhouse is served to the build over loopback HTTP instead of being sent as build context: no
3 GB context copy, no wheel layer, and about 10 % faster.
"""

import functools
import hashlib
import http.server
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from ci import wheelhouse
from ci.build_image import stream_build
from ci.engine import apt_install

NAME = "neuron-qwen3-standin"
ROOTFS_NAME = "neuron-qwen3-rootfs"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# python3-venv: the image makes its venv with it (the DLC's Python has venv built in).
PACKAGES = ("python3", "python3-venv", "python3-pip")
DOCKERFILE = REPO / "ci" / "standin" / "Dockerfile"
TORCH_LOCK = REPO / "requirements-torch.lock"
WHEELS = REPO / "build" / "standin-wheels"
# Measured: the engine's data root grew by 11.6 GB while building the stand-in (torch's closure, written once by
# pip in the build container and again when docker commits that layer), then settled at 6.0 GB.
BUILD_DISK_GB = 13


def log(message):
    print(f"[standin] {message}", file=sys.stderr, flush=True)


def key():
    digest = hashlib.sha256()
    for part in (SUITE, MIRROR, " ".join(PACKAGES), DOCKERFILE.read_bytes(), TORCH_LOCK.read_bytes()):
        digest.update(part if isinstance(part, bytes) else part.encode())
    return digest.hexdigest()[:12]


def torch_version():
    return next(r.version for r in wheelhouse.parse_lock(TORCH_LOCK) if r.name == "torch")


def tag():
    return f"{NAME}:torch{torch_version()}-{key()}"


def _exists(client, ref):
    try:
        client.images.get(ref)
        return True
    except Exception:  # docker.errors.ImageNotFound
        return False


def _rootfs(client):
    """debootstrap -> docker import; tagged by suite + packages."""
    ref = f"{ROOTFS_NAME}:{SUITE}-" + hashlib.sha256(f"{MIRROR} {' '.join(PACKAGES)}".encode()).hexdigest()[:12]
    if _exists(client, ref):
        return ref
    apt_install("debootstrap", "debootstrap")
    with tempfile.TemporaryDirectory(prefix="standin-rootfs-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "root"
        started = time.monotonic()
        argv = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(root), MIRROR]
        log(" ".join(argv))
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"debootstrap failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):  # downloaded .debs and indexes
            for path in (root / junk).glob("*"):
                if path.is_file():
                    path.unlink()
        log(f"debootstrap {time.monotonic() - started:.0f}s; importing as {ref}")
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        repository, _, image_tag = ref.partition(":")
        client.api.import_image_from_stream(
            tar.stdout, repository=repository, tag=image_tag, changes=["ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]']
        )
        if tar.wait():
            raise RuntimeError("tar of the debootstrap root failed")
    return ref


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _serve(directory):
    """A loopback HTTP server over `directory` (pip's --find-links reads its listing); returns (url, server)."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(directory))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/", server


def check_room(client, need_gb=BUILD_DISK_GB):
    """Fail in one line, before a build that would stop with ENOSPC halfway, when the engine's disk is short."""
    root = Path(client.info()["DockerRootDir"])
    if not root.exists():  # an engine on another host or in a VM: its disk is not ours to read
        return
    free = shutil.disk_usage(root).free / 1e9
    if free < need_gb:
        raise RuntimeError(
            f"building the stand-in base needs about {need_gb} GB free in {root} (the engine's "
            f"data root), {free:.1f} GB are free"
        )


def ensure(client, log_stream=sys.stderr):
    """The stand-in's tag, building it (and its root filesystem) when the engine does not have it yet."""
    ref = tag()
    if _exists(client, ref):
        log(f"reusing {ref}")
        return ref
    check_room(client)
    started = time.monotonic()
    rootfs = _rootfs(client)
    target = wheelhouse.host_target()
    if target["python_version"] != "3.11":  # Debian 12's; the wheels must be for it
        target = {
            **target,
            "python_version": "3.11",
            "python_full_version": "3.11.2",
            "implementation_version": "3.11.2",
        }
    wheelhouse.prepare(wheelhouse.parse_lock(TORCH_LOCK), {**target, "glibc": "2.36"}, WHEELS, log=log)
    url, server = _serve(WHEELS)
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        tar.add(DOCKERFILE, arcname="Dockerfile")
        tar.add(TORCH_LOCK, arcname="requirements-torch.lock")
    context.seek(0)
    try:
        stream_build(
            client,
            fileobj=context,
            custom_context=True,
            tag=ref,
            network_mode="host",
            buildargs={"ROOTFS": rootfs, "WHEELS_URL": url},
            out=log_stream,
        )
    finally:
        server.shutdown()
    shutil.rmtree(WHEELS)  # hard links into build/wheels (or 3 GB downloaded); the image is keyed, not needed again
    for image in client.images.list(name=NAME):  # stand-ins of older inputs: untag; delete once unused
        if ref not in image.tags:
            log(f"removing the outdated {', '.join(image.tags)}")
            for old in image.tags:
                client.images.remove(old)
            try:
                client.images.remove(image.id)
            except Exception:  # images built on it still exist (ci/smoke.py prunes old project images)
                pass
    log(f"built {ref} in {time.monotonic() - started:.0f}s")
    return ref


if __name__ == "__main__":
    from ci.engine import Engine

    with Engine() as engine_client:
        print(ensure(engine_client))
