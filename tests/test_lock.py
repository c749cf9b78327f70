"""The hashed locks, read from the files alone: complete, consistent, torch-free where they must be.

requirements.lock is what the image installs on top of the DLC (never torch); requirements-torch.lock
pins the host torch (the only place it is pinned); requirements-dev.lock is for tests and CI.
Nothing here asks the package index: that the locks install is proven by `make venv` and the image job, and
whether `make lock` still gives the same pins today is `make lock-check` (ci/lock_check.py), run when updating pins.
Run: .venv/bin/python -m pytest tests/test_lock.py -q -rs
"""

import importlib.metadata as metadata
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement as Spec
from packaging.utils import canonicalize_name

from ci import wheelhouse

REPO = Path(__file__).resolve().parent.parent
LOCKS = ("requirements.lock", "requirements-torch.lock", "requirements-dev.lock")
# Never in the image lock: the base image's Neuron-built torch stack, or CUDA.
FORBIDDEN = re.compile(r"^(torch|torch-neuronx|torch-xla|neuronx-cc|triton|nvidia-.*|cuda-.*|libneuronxla)$")
PY311 = {**wheelhouse.host_target(), "python_version": "3.11", "python_full_version": "3.11.7"}
PY314 = {**PY311, "python_version": "3.14", "python_full_version": "3.14.0", "implementation_version": "3.14.0"}


def lock(name):
    return wheelhouse.parse_lock(REPO / name)


def makefile_no_emit():
    text = re.sub(r"\\\n", " ", (REPO / "Makefile").read_text())
    return set(re.search(r"^NO_EMIT := (.*)$", text, re.M)[1].split())


@pytest.mark.parametrize("name", LOCKS)
def test_every_requirement_is_pinned_and_hashed(name):
    entries = lock(name)
    assert entries, f"{name} is empty"
    for entry in entries:
        assert entry.version and re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", entry.version), f"{name}: {entry}"
        assert entry.hashes and all(h.startswith("sha256:") for h in entry.hashes), f"{name}: {entry.name} unhashed"
    assert "make lock" in (REPO / name).read_text().splitlines()[1], f"{name} was not made by `make lock`"


@pytest.mark.parametrize("name", LOCKS)
def test_every_input_is_in_its_lock(name):
    """Each requirement of requirements*.in is pinned in the lock made from it, at a version the .in allows."""
    source = REPO / name.replace(".lock", ".in")
    pins = {e.name: e.version for e in lock(name)}
    wanted = [
        Spec(line.split("#", 1)[0].strip()) for line in source.read_text().splitlines() if line.split("#", 1)[0].strip()
    ]
    assert wanted, f"{source.name} names no requirement"
    for spec in wanted:
        pinned = pins.get(canonicalize_name(spec.name))
        assert pinned, f"{spec.name} of {source.name} is not in {name}: run `make lock`"
        assert spec.specifier.contains(pinned, prereleases=True), (
            f"{name} pins {spec.name}=={pinned}, {source.name} says {spec}"
        )


def test_image_lock_never_brings_torch():
    bad = [e.name for e in lock("requirements.lock") if FORBIDDEN.match(e.name)]
    assert not bad, f"requirements.lock would replace the base's torch stack: {bad}"
    pins = {e.name: e.version for e in lock("requirements.lock")}
    assert pins["torchtitan"] == "0.3.0" and pins["transformers"] == "5.16.0"


def test_no_emit_list_is_exactly_what_only_torch_needs():
    """NO_EMIT in the Makefile = the torch lock minus the image lock: torch and the packages only it needs."""
    torch_only = {e.name for e in lock("requirements-torch.lock")} - {e.name for e in lock("requirements.lock")}
    assert makefile_no_emit() == torch_only


def test_torch_is_pinned_in_one_place():
    assert [(e.name, e.version) for e in lock("requirements-torch.lock") if e.name == "torch"] == [("torch", "2.14.1")]
    pins = [
        path.name
        for path in REPO.glob("*")
        if path.is_file()
        and path.suffix in ("", ".in", ".txt", ".toml")
        and re.search(r"^\s*torch\s*==", path.read_text(errors="ignore"), re.M)
    ]
    assert pins == ["requirements-torch.in"], pins


def test_locks_agree_where_they_overlap():
    """`make venv` installs the three together: a package in two locks has one version and one set of hashes."""
    seen = {}
    for name in LOCKS:
        for entry in lock(name):
            key = (entry.name, entry.marker)
            if key in seen:
                other, first = seen[key]
                assert (entry.version, set(entry.hashes)) == (first.version, set(first.hashes)), (
                    f"{entry.name}: {name} has {entry.version}, {other} has {first.version}"
                )
            seen[key] = (name, entry)


def test_image_lock_is_a_closed_set_on_the_base():
    """Each dependency of each package in requirements.lock is in it, or is one the base brings (NO_EMIT)."""
    pins = {e.name for e in lock("requirements.lock") if wheelhouse.applies(e, PY311)}
    missing = []
    for name in sorted(pins):
        for raw in metadata.requires(name) or ():
            spec = Spec(raw)
            if spec.marker and not spec.marker.evaluate({**PY311, "extra": ""}):
                continue
            dep = canonicalize_name(spec.name)
            if dep not in pins and dep not in makefile_no_emit():
                missing.append(f"{name} -> {raw}")
    assert not missing, missing


def test_markers_select_per_target_python():
    numpy = {
        target: [e.version for e in lock("requirements.lock") if e.name == "numpy" and wheelhouse.applies(e, env)]
        for target, env in (("3.11", PY311), ("3.14", PY314))
    }
    assert len(numpy["3.11"]) == 1 and len(numpy["3.14"]) == 1, numpy
    assert wheelhouse.platform_tags({"platform_machine": "x86_64", "glibc": "2.39"})[0] == "manylinux_2_39_x86_64"
