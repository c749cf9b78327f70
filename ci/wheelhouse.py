"""Hashed locks -> a folder of wheels for one target Python, downloaded on the host, for hermetic builds.

Inside a container pip cannot verify TLS on these hosts (an intercepting CA only the host trusts), and
air-gapped hosts have no index at all, so images install from wheels the host downloaded. The lock is
universal (environment markers); the target is the base image's Python, which may differ from the
host's (the DLC has 3.14, hosts here 3.11). pip evaluates markers with the interpreter it runs in, so
markers are evaluated here against the target (probed from the base image) and dropped before
`pip download --python-version ... --platform ...` sees the file.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name, parse_wheel_filename

# `make venv` downloads every wheel of the three locks for this host here (Makefile: WHEELS). A target that
# matches the host (the stand-in base: CPython 3.11, manylinux) finds all its wheels in it, so the image job
# needs no package index after `make venv`; another target (the DLC's 3.14) falls back to `pip download`.
LOCAL_WHEELS = Path(__file__).resolve().parent.parent / "build" / "wheels"

# Printed by the base image's python3: what markers and wheel tags need to know. No import of torch
# (seconds), no pip: metadata only.
PROBE = r"""
import importlib.metadata as md, importlib.util as iu, json, os, platform, sys
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
libc = (os.confstr("CS_GNU_LIBC_VERSION") or "glibc 0.0").split()[1]
print(json.dumps({
    "implementation_name": sys.implementation.name,
    "implementation_version": platform.python_version(),
    "os_name": os.name,
    "platform_machine": platform.machine(),
    "platform_python_implementation": platform.python_implementation(),
    "platform_release": platform.release(),
    "platform_system": platform.system(),
    "platform_version": platform.version(),
    "python_full_version": platform.python_version(),
    "python_version": ".".join(platform.python_version_tuple()[:2]),
    "sys_platform": sys.platform,
    "glibc": libc,
    "torch": version("torch"),
    "torch_neuronx": version("torch-neuronx"),
    "triton": iu.find_spec("triton") is not None,
}))
"""


@dataclass(frozen=True)
class Requirement:
    name: str  # canonical
    version: str
    marker: str  # "" when none
    hashes: tuple

    def line(self):
        return f"{self.name}=={self.version} " + " ".join(f"--hash={h}" for h in self.hashes)


def parse_lock(path):
    """Requirements of a `uv pip compile --generate-hashes` lock, in file order."""
    text = re.sub(r"\\\n\s*", " ", Path(path).read_text())
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        hashes = tuple(re.findall(r"--hash=(\S+)", line))
        spec = line.split("--hash", 1)[0].strip()
        requirement, _, marker = spec.partition(";")
        name, _, version = requirement.strip().partition("==")
        out.append(Requirement(canonicalize_name(name), version.strip(), marker.strip(), hashes))
    return out


def applies(requirement, target):
    return not requirement.marker or Marker(requirement.marker).evaluate(environment=target)


def probe(client, image):
    """The marker environment (+ glibc, torch, triton) of `image`'s python3."""
    out = client.containers.run(
        image, ["-c", PROBE], entrypoint="python3", network_mode="none", remove=True, stdout=True, stderr=True
    )
    return json.loads(out.decode().strip().splitlines()[-1])


def host_target():
    """The same for this interpreter (tests, and hosts without an engine)."""
    return json.loads(subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True, text=True).stdout)


def platform_tags(target):
    """pip --platform values a wheel for this target may carry: manylinux_2_5 .. the base's glibc."""
    machine = target["platform_machine"]
    major, minor = (int(part) for part in target["glibc"].split(".")[:2])
    tags = [f"manylinux_{major}_{m}_{machine}" for m in range(minor, 4, -1)]
    legacy = {"x86_64": ["manylinux2014", "manylinux2010", "manylinux1"], "aarch64": ["manylinux2014"]}
    return tags + [f"{name}_{machine}" for name in legacy.get(machine, [])] + [f"linux_{machine}"]


def _complete(wanted, dest):
    """Every wanted requirement has a wheel in `dest` whose sha256 the lock lists (a second build skips pip)."""
    present = {}
    for path in dest.glob("*.whl"):
        name, version, *_ = parse_wheel_filename(path.name)
        present.setdefault((name, str(version)), []).append(path)
    for requirement in wanted:
        paths = present.get((requirement.name, requirement.version), [])
        if not any(f"sha256:{_sha256(path)}" in requirement.hashes for path in paths):
            return False
    return True


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fits(tags, target):
    """Whether a wheel with these tags installs on the target's CPython and platform."""
    major, minor = target["python_version"].split(".")
    platforms = set(platform_tags(target)) | {"any"}

    def python_ok(tag):
        if tag.abi == "abi3":  # stable ABI: built for cp3N, good on every later 3.x
            return tag.interpreter.startswith("cp3") and int(tag.interpreter[3:]) <= int(minor)
        return tag.interpreter in {f"cp{major}{minor}", f"py{major}", f"py{major}{minor}"} and tag.abi in {
            f"cp{major}{minor}",
            "none",
        }

    return any(python_ok(tag) and tag.platform in platforms for tag in tags)


def _link_local(wanted, target, dest, source=LOCAL_WHEELS):
    """Hard-link (else copy) into `dest` each wheel of `source` that a wanted pin names; hashes are checked later."""
    versions = {(r.name, r.version) for r in wanted}
    for path in source.glob("*.whl") if source.is_dir() else ():
        name, version, _, tags = parse_wheel_filename(path.name)
        if (name, str(version)) in versions and _fits(tags, target) and not (dest / path.name).exists():
            try:
                os.link(path, dest / path.name)
            except OSError:
                shutil.copy2(path, dest / path.name)


def prepare(requirements, target, dest, log=print):
    """Download the wheels of `requirements` that apply to `target` into `dest`; drop any other file there.

    Returns the requirements file (markers resolved, hashes kept) that pip in the build will read.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    wanted = [r for r in requirements if applies(r, target)]
    req_file = dest / "wheelhouse-requirements.txt"
    req_file.write_text("".join(r.line() + "\n" for r in wanted))
    keep = {(r.name, r.version) for r in wanted}
    for path in dest.glob("*.whl"):  # stale wheels from another lock or target: keep the context small
        name, version, *_ = parse_wheel_filename(path.name)
        if (name, str(version)) not in keep:
            path.unlink()
    _link_local(wanted, target, dest)
    if _complete(wanted, dest):
        log(f"wheelhouse: all {len(wanted)} wheels in {dest}, hashes match")
        return req_file
    py = target["python_version"].replace(".", "")
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--require-hashes",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        py,
        "--abi",
        f"cp{py}",
        "--abi",
        "abi3",
        "--abi",
        "none",
        *[arg for tag in platform_tags(target) for arg in ("--platform", tag)],
        "-r",
        str(req_file),
        "-d",
        str(dest),
    ]
    log(
        f"wheelhouse: {len(wanted)} wheels for CPython {target['python_version']} "
        f"({target['platform_machine']}, glibc {target['glibc']}) -> {dest}"
    )
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"pip download failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return req_file
