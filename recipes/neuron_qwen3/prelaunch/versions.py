"""The pre-launch pass's version check: the installed torch, torch-neuronx, transformers and torchtitan against what
the image was built with, else against the pip locks. Nothing is imported: a mismatch is found before torch is.
"""

import importlib.metadata
import importlib.util
import os
import re

CHECKED = ("torch", "torch-neuronx", "transformers", "torchtitan")
IMAGE_BUILD = "image-build.lock"  # written by the image build (ci/image/record-build.py); only in the image
IMAGE_LOCK = "requirements.lock"  # what the image installs on top of the Neuron DLC
HOST_LOCK = "requirements-torch.lock"  # the torch of hosts without the DLC (dev machines, CI, the stand-in base)
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def _name(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path) -> dict:
    """{normalised name: {versions}} of the `name==version` lines of a pip lock (several when markers differ)."""
    found = {}
    with open(path) as f:
        for line in f:
            match = PIN.match(line)
            if match:
                found.setdefault(_name(match[1]), set()).add(match[2])
    return found


def _same(installed, pinned):
    """pip's `==` rule: a pin without a local label (+cpu) accepts any local label."""
    return installed == pinned or ("+" not in pinned and installed.split("+")[0] == pinned)


def built_with(lock_dir) -> str | None:
    """The TORCHTITAN build arg the image was built with (its label, recorded in IMAGE_BUILD); None outside an image."""
    try:
        with open(os.path.join(lock_dir, IMAGE_BUILD)) as f:
            return next((line.split("=", 1)[1].strip() for line in f if line.startswith("# TORCHTITAN=")), None)
    except FileNotFoundError:
        return None


def versions(lock_dir, version=importlib.metadata.version, neuron_dlc=None) -> tuple[list, list]:
    """The installed versions of CHECKED against what the image was built with, else against the locks.

    In the image, IMAGE_BUILD records the base's torch and torch-neuronx (no lock pins them: they come with the DLC)
    and the torchtitan of its TORCHTITAN build arg (the fork replaces the lock's 0.3.0); its versions come first.
    requirements-torch.lock pins the torch of hosts without the Neuron DLC, so it is not read where torch_neuronx
    is installed. A missing lock is a warning and skips its pins; IMAGE_BUILD exists only in the image. Returns
    (problems, warnings); nothing is imported."""
    if neuron_dlc is None:
        neuron_dlc = importlib.util.find_spec("torch_neuronx") is not None
    problems, warnings, pinned = [], [], {}
    label = built_with(lock_dir)
    for lock in (IMAGE_BUILD, IMAGE_LOCK) if neuron_dlc else (IMAGE_BUILD, IMAGE_LOCK, HOST_LOCK):
        path = os.path.join(lock_dir, lock)
        try:
            for name, found in pins(path).items():
                pinned.setdefault(name, (lock, found))
        except FileNotFoundError:
            if lock != IMAGE_BUILD:
                warnings.append(f"no {path}: installed package versions not checked against it")
    for name in CHECKED:
        if name not in pinned:
            continue
        lock, wanted = pinned[name]
        source = f"{lock} (this image was built with TORCHTITAN={label})" if lock == IMAGE_BUILD else lock
        try:
            have = version(name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{name} is not installed but {source} pins {' or '.join(sorted(wanted))}")
            continue
        if not any(_same(have, pin) for pin in wanted):
            problems.append(
                f"{name} {have} is installed but {source} pins {' or '.join(sorted(wanted))}: "
                "rebuild the image (or `make venv`), or PREFLIGHT=warn to run anyway"
            )
    return problems, warnings
