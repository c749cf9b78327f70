"""`make venv` on a disk too small for it fails at once, in one line, before it downloads a wheel."""

import os
import re
import shutil
import subprocess
import sys

from conftest import REPO


def test_make_venv_refuses_a_disk_without_room_before_downloading(tmp_path):
    for path in [REPO / "Makefile", REPO / "pyproject.toml", *REPO.glob("requirements*.lock")]:
        shutil.copy(path, tmp_path)
    need = int(shutil.disk_usage(tmp_path).free / 1e9) + 1000
    # Under `make test` this make is a sub-make: without the parent's variables it runs as a user's would.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "venv", f"VENV_DISK_GB={need}", f"PYTHON={sys.executable}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0, done.stdout
    said = [line for line in done.stderr.splitlines() if not re.match(r"make(\[\d+\])?: \*\*\*", line)]
    assert len(said) == 1, done.stderr
    assert re.fullmatch(
        rf"make venv needs about {need} GB free in {re.escape(str(tmp_path))} "
        r"for \.venv and build/wheels, \d+\.\d GB are free",
        said[0],
    ), said[0]
    assert not (tmp_path / ".venv").exists() and not (tmp_path / "build").exists()
