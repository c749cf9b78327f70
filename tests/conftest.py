"""Shared helpers: where things are, and how to run a Python snippet the way a worker runs."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_qwen3 import selftest

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "recipes"
SCENARIOS = Path(__file__).resolve().parent / "scenarios"
# Every child (launcher, torchrun, workers) imports this checkout's code, not whichever checkout the venv's
# editable install points at: a test's result depends on the commit under test.
os.environ["PYTHONPATH"] = os.pathsep.join([str(RECIPES), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])


def worker_env(**extra) -> dict:
    """The environment the launcher gives a smoke worker: offline, unbuffered."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.update(extra)
    return env


def run_scenario(name: str, *args: str, nproc: int = 1, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run tests/scenarios/<name>.py in a fresh interpreter (patches are process-global)."""
    script = str(SCENARIOS / f"{name}.py")
    if nproc == 1:
        cmd = [sys.executable, script, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", script, *args]
    return subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=timeout, cwd=REPO)


ANSI = re.compile(selftest.COLOUR)  # torchtitan colours its log lines
STEP_LOSS = re.compile(selftest.LOSS_LINE)  # `step: N  loss: X`, the one pattern the launcher and tests read


def stand_in(tmp_path, package: str, source: str, **env) -> dict:
    """An environment in which `import <package>` loads `source` (a stand-in written under tmp_path), as a child
    process sees it: the stand-in first on PYTHONPATH, then the repository; `env` added."""
    folder = tmp_path / "stand-ins" / package
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(source)
    return {"PYTHONPATH": f"{folder.parent}{os.pathsep}{REPO}", "PATH": os.environ["PATH"], **env}


# `python -m entrypoint ARGS` with discovery and the /dev checks looking under ROOT (a fake /dev), as cli.main's
# `root` parameter allows: the launcher exactly as the container runs it, on any host.
ROOTED = "import sys; from entrypoint import cli; sys.exit(cli.main(sys.argv[2:], root=sys.argv[1]))"


def launcher_at(root, *args) -> list:
    return [sys.executable, "-c", ROOTED, str(root), *args]


@pytest.fixture(scope="session")
def qwen_size_tokenizer(tmp_path_factory) -> str:
    """The folder of a tokenizer of Qwen's real size (tests/qwen_size.py), built once per session."""
    import qwen_size

    return qwen_size.build(tmp_path_factory.mktemp("qwen-size-tokenizer"))
