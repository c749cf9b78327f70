"""`make lock-check`: do the locks still say what `make lock` says today? Asks the package index; not a test.

    .venv/bin/python -m ci.lock_check

Two questions, both about the live index, so they live here and not in `make test` (a test's result must
depend only on the commit, and an index serves new releases every day; `--exclude-newer` cannot pin a
resolution where the index publishes no upload times, as file mirrors and proxies often don't):
1. `make lock` into a temporary folder: the same pins and hashes as the committed locks?
2. requirements.lock installs for the DLC's CPython 3.14 (manylinux x86_64) from the index, hashes checked.
A maintainer runs it when updating pins (README: "Updating the pins"); exit status 1 says what differs.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name

from ci import wheelhouse

REPO = Path(__file__).resolve().parent.parent
LOCKS = ("requirements.lock", "requirements-torch.lock", "requirements-dev.lock")


def regenerate(folder):
    """Problems found when `make lock` writes the locks into `folder` and they are compared with the repo's."""
    done = subprocess.run(
        ["make", "-s", "-o", ".venv/.locks-installed", "lock", f"LOCK_DIR={folder}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        return [f"make lock could not resolve:\n{done.stderr[-3000:]}"]
    problems = []
    for name in LOCKS:
        ours = {(r.name, r.marker): r for r in wheelhouse.parse_lock(REPO / name)}
        theirs = {(r.name, r.marker): r for r in wheelhouse.parse_lock(Path(folder) / name)}
        for key in sorted(ours.keys() | theirs.keys()):
            a, b = ours.get(key), theirs.get(key)
            if a is None or b is None or (a.version, set(a.hashes)) != (b.version, set(b.hashes)):
                problems.append(
                    f"{name}: {key[0]} {a.version if a else '(absent)'} -> {b.version if b else '(absent)'}"
                )
    return problems


def installs_on_python_314(folder):
    """Problems installing requirements.lock for the DLC's Python 3.14 (wheels only, hashes required)."""
    site = Path(folder) / "site"
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "uv"),
            "pip",
            "install",
            "--quiet",
            "--target",
            str(site),
            "--python-version",
            "3.14",
            "--python-platform",
            "x86_64-manylinux_2_28",
            "--only-binary",
            ":all:",
            "--require-hashes",
            "--no-deps",
            "-r",
            str(REPO / "requirements.lock"),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        return [f"requirements.lock does not install for CPython 3.14:\n{done.stderr[-3000:]}"]
    target = {
        **wheelhouse.host_target(),
        "python_version": "3.14",
        "python_full_version": "3.14.0",
        "implementation_version": "3.14.0",
    }
    installed = {canonicalize_name(p.name.split("-")[0]) for p in site.glob("*.dist-info")}
    missing = {r.name for r in wheelhouse.parse_lock(REPO / "requirements.lock") if wheelhouse.applies(r, target)}
    missing -= installed
    problems = [f"not installed for 3.14: {sorted(missing)}"] if missing else []
    if not list(site.glob("numpy/_core/*.cpython-314-x86_64-linux-gnu.so")):
        problems.append("numpy for 3.14 brought no cpython-314 extension")
    return problems


def main():
    with tempfile.TemporaryDirectory(prefix="lock-check-") as folder:
        problems = regenerate(folder)
        print("make lock reproduces the locks" if not problems else "the locks differ from `make lock` today:")
        problems += installs_on_python_314(folder)
    for problem in problems:
        print(f"  {problem}")
    if problems:
        print("update the pins: `make lock`, then `make venv test` (README: Updating the pins)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
