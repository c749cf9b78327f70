"""A built wheel, not the editable install, carries the whole project. Built offline from a copy of the files git
would commit (as a fresh clone builds them) and installed into a fresh venv whose dependencies come from the locked
venv, it holds every tracked module and asset, every module imports from it (none from the checkout), and
`python -m entrypoint --dry-run` at smoke scale runs from it, recipes' child included, with the assets it ships.

Run: .venv/bin/python -m pytest tests/test_wheel.py -q
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.training
PACKAGES = ("entrypoint", "neuron_qwen3")
# Imported by nothing: `python -m entrypoint` runs it (and exits), which test_the_dry_run_runs_from_the_wheel does.
NOT_IMPORTED = {"entrypoint.__main__": "a script: importing it runs the launcher and exits"}
# Every module of both packages, imported in the fresh venv; the editable install's finder must not have run.
IMPORT_ALL = f"""
import importlib, json, pkgutil, sys
files, errors = {{}}, {{}}
for name in {PACKAGES!r}:
    package = importlib.import_module(name)
    files[name] = package.__file__
    for module in pkgutil.walk_packages(package.__path__, name + ".", onerror=lambda n: errors.setdefault(n, "walk")):
        if module.name in {sorted(NOT_IMPORTED)!r}:
            continue
        try:
            files[module.name] = importlib.import_module(module.name).__file__
        except BaseException as error:
            errors[module.name] = repr(error)
print(json.dumps({{"files": files, "errors": errors, "path": sys.path,
                  "editable": [name for name in sys.modules if name.startswith("__editable__")]}}))
"""


def tracked(*paths) -> list:
    """The files git would commit (tracked, or new and not ignored): the source tree under test, without build
    outputs, caches or the venv."""
    return subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard", *paths],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")[:-1]


def clean_env(**extra) -> dict:
    return {"PATH": os.environ["PATH"], **extra}  # no PYTHONPATH: conftest points it at the checkout


def checked(*cmd) -> str:
    result = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """(wheel file, fresh venv's python, its site-packages): built from a copy of tracked(), so the checkout
    gets no build/ or *.egg-info; installed with --no-deps --no-index; the locked venv named by a .pth line."""
    tmp = tmp_path_factory.mktemp("wheel")
    for path in tracked():
        if (REPO / path).is_file():  # a tracked file deleted in the working tree is not built
            (tmp / "src" / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / path, tmp / "src" / path)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    checked(*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", tmp / "dist", tmp / "src")
    (built,) = (tmp / "dist").glob("neuron_qwen3-*.whl")
    checked(sys.executable, "-m", "venv", "--without-pip", tmp / "venv")
    python = tmp / "venv" / "bin" / "python"
    site = Path(checked(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip())
    checked(*pip, "install", "--no-deps", "--no-index", "--target", site, built)
    (site / "locked-venv.pth").write_text(sysconfig.get_path("purelib") + "\n")  # the dependencies
    return built, python, site


def test_the_wheel_holds_every_tracked_module_and_asset(wheel):
    names = set(zipfile.ZipFile(wheel[0]).namelist())
    assets = tracked("recipes/neuron_qwen3/assets")  # tokenizer, corpus, config.json files
    assert assets and sorted({p.removeprefix("recipes/") for p in assets} - names) == []
    modules = [p for p in tracked("entrypoint", "recipes/neuron_qwen3") if p.endswith(".py")]
    assert sorted({p.removeprefix("recipes/") for p in modules} - names) == []


def test_every_module_imports_from_the_wheel_not_the_checkout(wheel, tmp_path):
    _, python, site = wheel
    locked = sysconfig.get_path("purelib")
    assert list(Path(locked).glob("__editable__*.pth"))  # what must not leak in: the editable install's hook
    result = subprocess.run(
        [python, "-c", IMPORT_ALL], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert found["errors"] == {} and found["editable"] == [] and locked in found["path"]
    assert all(Path(file).is_relative_to(site) for file in found["files"].values()), found["files"]
    # and the walk met every module git tracks (so none was skipped unseen)
    tracked_modules = {
        p.removeprefix("recipes/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for p in tracked("entrypoint", "recipes/neuron_qwen3")
        if p.endswith(".py") and "/assets/" not in p
    }
    assert tracked_modules - set(NOT_IMPORTED) == set(found["files"])


def test_the_dry_run_runs_from_the_wheel(wheel, tmp_path):
    _, python, site = wheel
    result = subprocess.run(
        [python, "-m", "entrypoint", "--dry-run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(
            SCALE="smoke",
            DEVICE="cpu",
            OUTPUT_DIR=str(tmp_path / "out"),
            CACHE_DIR=str(tmp_path / "cache"),
            HF_HUB_OFFLINE="1",
        ),
    )
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    argv = shown["argv"]  # the torchrun command: this venv's python, torchtitan with the recipes' smoke config
    assert argv[0] == str(python) and argv[1:3] == ["-m", "torch.distributed.run"] and "torchtitan.train" in argv
    assert argv[argv.index("--config") + 1] == shown["config"] == "native_qwen3_smoke"
    config = shown["torchtitan_config"]  # what the recipes' child built, from the assets the wheel ships
    assert config["training"]["steps"] > 0 and config["model_spec"]["flavor"] == "smoke"
    for folder in (config["hf_assets_path"], config["dataloader"]["source"]):
        assert Path(folder).is_relative_to(site) and any(Path(folder).iterdir()), folder
