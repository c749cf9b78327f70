"""The README's tables are copies of the variant table and the env contract, and its commands are what CI and a
trn2 user run: keep them in step."""

import re
import shlex

from conftest import REPO

from entrypoint.contract import README_GROUPS, VARS, parse
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
        if var.group not in README_GROUPS:
            continue  # the others are in docs/production.md (tests/test_deploy.py checks that table)
        default = f"`{var.default}`" if var.default else "-"
        assert f"| `{var.name}` | {default} | {var.allowed} |" in README, f"README's row for {var.name} is stale"


def fenced(text):
    return re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S)


def test_the_two_setup_commands_are_what_ci_runs():
    two = next(block for block in fenced(README) if "make train" in block)
    commands = [line.split("#", 1)[0].strip() for line in two.splitlines()]
    assert commands == ["make train", "make test"], commands
    assert (REPO / ".ci" / "run").read_text().strip().splitlines()[-1] == "make test"
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^train: venv\n\t.*-m entrypoint$", makefile, re.M)
    assert re.search(r"^test: venv\n\t\$\(PY\) -m pytest -q -rsxX$", makefile, re.M)


def test_the_production_command_parses_and_its_variables_pass_the_contract():
    block = next(block for block in fenced(README) if "docker run" in block)
    words = shlex.split(block[block.index("docker run"):].replace("\\\n", " "))
    image = words.index("neuron-qwen3:latest")
    env = dict(words[i + 1].split("=", 1) for i, word in enumerate(words[:image]) if word == "-e")
    assert set(env) <= {var.name for var in VARS}, set(env) - {var.name for var in VARS}
    settings = parse(env)
    assert settings.checkpoint_dir.startswith("/data/") and settings.steps
    devices = [word.split("=", 1)[1] for word in words[:image] if word.startswith("--device=")]
    assert devices == [f"/dev/neuron{i}" for i in range(16)], "a trn2.48xlarge has 16 Neuron devices"
    assert "--shm-size=64g" in words and "nofile=65536:65536" in words
    uid = re.search(r"^ARG APP_UID=(\d+)$", (REPO / "Dockerfile").read_text(), re.M)[1]  # the image's user
    assert "/mnt/neuron-qwen3:/data" in words and f"chown {uid}:{uid} /mnt/neuron-qwen3" in block


def test_the_disk_figures_are_the_checks_make_venv_and_the_image_job_make():
    from ci import standin

    venv_gb = re.search(r"^VENV_DISK_GB \?= (\d+)$", (REPO / "Makefile").read_text(), re.M)[1]
    assert f"refuses to start with less than {venv_gb} GB free" in README
    assert f"checks for {standin.BUILD_DISK_GB} GB first" in README
