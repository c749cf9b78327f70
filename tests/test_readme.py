"""The docs' tables are rendered from the code (`make docs`, ci/docs.py), and the README's commands are what CI and a
trn2 user run: keep them in step."""

import re
import shlex

from conftest import REPO

from ci import docs
from entrypoint.contract import VARS, parse

README = (REPO / "README.md").read_text()


def test_the_generated_tables_are_current():
    """The docs (ci/docs.py's DOCS) hold the variant table and every settings table as the code renders them."""
    assert docs.main(["--check"]) == 0, "run `make docs`"
    text = "".join((REPO / name).read_text() for name in docs.DOCS)
    for name in docs.blocks():
        assert f"<!-- generated: {name} -->" in text, f"no table {name!r} in the docs"
    for var in VARS:  # every variable is in one of them
        assert f"| `{var.name}` |" in text, var.name


def test_the_settings_table_lists_each_variable_with_its_flag():
    table = docs.settings_table({"run"}).splitlines()
    steps = next(row for row in table if row.startswith("| `STEPS` |"))
    assert "`--training.steps`" in steps and len(table) == 2 + sum(var.group == "run" for var in VARS)


def fenced(text):
    return re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S)


def test_the_two_setup_commands_are_what_ci_runs():
    two = next(block for block in fenced(README) if "make train" in block)
    commands = [line.split("#", 1)[0].strip() for line in two.splitlines()]
    assert commands == ["make train", "make test"], commands
    assert (REPO / ".ci" / "run").read_text().strip().splitlines()[-1] == "make test"
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^train: venv\n\t.*-m entrypoint$", makefile, re.M)
    assert re.search(r"^test: ruff\n\t\$\(PY\) -m pytest -q -rsxX --durations=10$", makefile, re.M)
    assert re.search(
        r"^ruff: venv\n\t\$\(VENV\)/bin/ruff check \.\n\t\$\(VENV\)/bin/ruff format --check \.$", makefile, re.M
    )


def test_the_production_command_parses_and_its_variables_pass_the_contract():
    block = next(block for block in fenced(README) if "docker run" in block)
    words = shlex.split(block[block.index("docker run") :].replace("\\\n", " "))
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


def test_the_readme_stays_short_and_no_doc_names_an_issue_number():
    """The README is the user's page: at most 200 lines. Docs say the reason, not a tracker's number."""
    assert len(README.splitlines()) <= 200, "README.md: move detail to docs/"
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        named = re.findall(r"\b[Ii]ssues? #?\d+", path.read_text())
        assert not named, f"{path.relative_to(REPO)} names {named}: say the reason instead"


def test_the_docs_links_resolve():
    """Every relative link of README.md and docs/*.md points at a file of the repository."""
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text()):
            assert (path.parent / target).exists(), f"{path.relative_to(REPO)} links to {target}, which is not there"
