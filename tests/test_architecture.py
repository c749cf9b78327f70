"""docs/architecture.md gives every module of the launcher and the recipes a line, and names none that is gone.

The modules are found by walking entrypoint/ and recipes/neuron_qwen3/ (every .py file but `__init__.py`, whose
folder's line stands for it). A module's line is either a line of the code block under a section whose heading
names its folder in backticks (`## The launcher: `entrypoint/``), starting with the file's name, or a backticked
`name.py` in the row of its folder (`| `data/` | ... |`) in that section's table.
Run: .venv/bin/python -m pytest tests/test_architecture.py -q
"""

import re

from conftest import REPO

DOC = REPO / "docs" / "architecture.md"
PACKAGES = ("entrypoint", "recipes/neuron_qwen3")


def modules() -> set[str]:
    """Every module of the packages, as its path from the repository's root."""
    return {
        path.relative_to(REPO).as_posix()
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    }


def documented() -> set[str]:
    """The modules docs/architecture.md gives a line, as paths from the repository's root."""
    found, folder, in_block = set(), None, False
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            heading = re.search(r"`([\w/]+/)`", line)
            folder = heading[1] if heading else None
        elif line.startswith("```"):
            in_block = not in_block
        elif folder and in_block and (name := re.match(r"([\w/]+\.py)(?=\s|$)", line)):
            found.add(folder + name[1])
        elif folder and (row := re.match(r"\| `([\w/]+/)` \|(.*)\|$", line)):
            found.update(folder + row[1] + name for name in re.findall(r"`(\w+\.py)`", row[2]))
    return found


def test_every_module_has_a_line():
    missing = sorted(modules() - documented())
    assert not missing, (
        f"docs/architecture.md has no line for {', '.join(missing)}: add each, with its job, to its folder's "
        "block or its row in the subpackages' table"
    )


def test_every_module_named_exists():
    gone = sorted(documented() - modules())
    assert not gone, f"docs/architecture.md names {', '.join(gone)}, which no longer exist: remove or rename them"
