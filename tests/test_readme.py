"""The README's tables are copies of the variant table and the env contract: keep them in step."""

import re

from conftest import REPO

from entrypoint.contract import VARS
from entrypoint.variants import DEFAULT_VARIANT, VARIANTS

README = (REPO / "README.md").read_text()


def test_every_variant_row_names_its_configs():
    for variant in VARIANTS.values():
        default = " (default)" if variant.name == DEFAULT_VARIANT else ""
        row = re.search(rf"^\| `{variant.name}`{re.escape(default)} \|.*$", README, re.M)
        assert row, f"README has no row for VARIANT={variant.name}"
        for config in variant.configs.values():
            assert f"`{config}`" in row.group(0)


def test_env_table_matches_the_contract():
    for var in VARS:
        if var.group not in ("run", "paths"):
            continue  # the others are in docs/production.md (tests/test_production.py checks that table)
        default = f"`{var.default}`" if var.default else "-"
        assert f"| `{var.name}` | {default} | {var.allowed} |" in README, f"README's row for {var.name} is stale"


def test_the_two_setup_commands_are_what_ci_runs():
    assert "make train" in README and "make test" in README
    assert (REPO / ".ci" / "run").read_text().strip().endswith("make test")
