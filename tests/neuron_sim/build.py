"""Build (once per source and torch) and load the simulated device's C++ extension.

The build folder is keyed by a hash of the source, torch's version and Python's, so a second process (a torchrun
worker, another test file) loads the library already built instead of compiling again; torch's cpp_extension
takes a lock in that folder, so two processes that start together build it once.
"""

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "csrc" / "neuron_sim.cpp"
NAME = "neuron_sim_ext"
REPO = HERE.parent.parent

# Seconds the last `load` spent compiling in this process (0.0 when the library was already built).
last_build_seconds = 0.0


def _key() -> str:
    import torch

    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(f"{torch.__version__}|{sys.version}|{sys.platform}".encode())
    return digest.hexdigest()[:16]


def build_root() -> Path:
    """NEURON_SIM_BUILD_DIR, else the checkout's pytest cache (git-ignored)."""
    root = os.environ.get("NEURON_SIM_BUILD_DIR")
    return Path(root) if root else REPO / ".pytest_cache" / "neuron_sim"


def build_dir() -> Path:
    return build_root() / _key()


def _library(folder: Path) -> Path:
    return folder / f"{NAME}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"


def _import(path: Path):
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_file_location(NAME, str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[NAME] = module
    return module


def load(verbose: bool = False):
    """The extension module: imported from its build folder, compiled there first if it is not built yet."""
    global last_build_seconds
    if NAME in sys.modules:
        return sys.modules[NAME]
    import torch  # noqa: F401  (the library links against torch's, which must be loaded first)

    folder = build_dir()
    library = _library(folder)
    if library.exists() and not (folder / "lock").exists():  # "lock": cpp_extension is building there now
        return _import(library)
    from torch.utils import cpp_extension

    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    module = cpp_extension.load(
        name=NAME,
        sources=[str(SOURCE)],
        build_directory=str(folder),
        extra_cflags=["-O1"],
        verbose=verbose,
    )
    last_build_seconds = time.perf_counter() - start
    return module
