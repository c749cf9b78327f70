"""`make docs`: the tables of the docs (DOCS), rendered from the code that defines them.

Each generated block sits between `<!-- generated: NAME -->` and `<!-- end: NAME -->`: the variant table
(entrypoint/variants.py, in README.md) and the settings tables (entrypoint/contract.py, by group: docs/settings.md
and docs/production.md). `--check` rewrites nothing and exits 1 when a block is stale (tests/test_readme.py runs it).
"""

import re
import sys
from pathlib import Path

from entrypoint import contract
from entrypoint.variants import DEFAULT_VARIANT, VARIANTS

REPO = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/settings.md", "docs/production.md")


def variant_table() -> str:
    rows = ["| `VARIANT` | what trains | full scale | smoke | bench (accelerator, CPU) |", "|---|---|---|---|---|"]
    rows += [
        f"| `{v.name}`{' (default)' if v.name == DEFAULT_VARIANT else ''} | {v.summary} | `{v.configs['full']}`"
        f" (any MODEL: `{v.model_config}`) | `{v.configs['smoke']}` | `{v.configs['bench']}`, "
        f"`{v.configs['bench_cpu']}` |"
        for v in VARIANTS.values()
    ]
    return "\n".join(rows)


def settings_table(groups) -> str:
    """The variables of the contract's `groups`, as docs/settings.md and docs/production.md show them."""
    rows = ["| variable | default | accepts | torchtitan flag | meaning |", "|---|---|---|---|---|"]
    rows += [
        f"| `{var.name}` | {f'`{var.default}`' if var.default else '-'} | {var.allowed} | "
        f"{f'`{var.flag}`' if var.flag else '-'} | {var.meaning} |"
        for var in contract.VARS
        if var.group in groups
    ]
    return "\n".join(rows)


def blocks() -> dict:
    """NAME -> the block's text."""
    found = {"variants": variant_table()}
    for groups in ({"run", "paths"}, {"rendezvous", "kubeflow", "slurm"}, {"faults", "preflight"}):
        found["settings " + " ".join(sorted(groups))] = settings_table(groups)
    return found


def render(text: str) -> str:
    """`text` with every generated block rewritten; a block name the code does not define is an error."""
    known = blocks()

    def fill(match):
        name = match[1]
        if name not in known:
            raise SystemExit(f"docs: no generated block named {name!r} (known: {', '.join(known)})")
        return f"<!-- generated: {name} -->\n{known[name]}\n<!-- end: {name} -->"

    return re.sub(r"<!-- generated: (.+?) -->\n.*?<!-- end: \1 -->", fill, text, flags=re.S)


def main(argv=None) -> int:
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    stale = []
    for name in DOCS:
        path = REPO / name
        text = path.read_text()
        new = render(text)
        if new != text:
            stale.append(name)
            if not check:
                path.write_text(new)
    if check and stale:
        print(f"docs: stale tables in {', '.join(stale)}: run `make docs`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
