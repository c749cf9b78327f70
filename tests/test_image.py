"""The image, built on the stand-in base and run for real (the CI image job, ci/smoke.py, under pytest).

Needs a Docker engine: the fixture uses the one that answers, or, as root (CI is), installs Debian's
docker.io and debootstrap and starts its own dockerd, stopped when the module ends. A missing
prerequisite is an error that says why, never a skip. Cold: about 6 minutes on 2 cores (stand-in
base ~3, image ~2, runs ~1); the stand-in is reused while its inputs are unchanged.
Run: .venv/bin/python -m pytest tests/test_image.py -q -rs      (or `make smoke` for the plain job)
"""

import re
import shutil
import time

import pytest
from dockerfile_parse import DockerfileParser

from ci import build_image, smoke, standin
from ci.engine import Engine

REPO = build_image.REPO


# ---- static: no engine needed ------------------------------------------------------------------


def instructions(path="Dockerfile"):
    return [
        (i["instruction"], i["value"])
        for i in DockerfileParser(str(REPO / path)).structure
        if i["instruction"] != "COMMENT"
    ]


def test_dockerfile_shape():
    steps = instructions()
    names = [name for name, _ in steps]
    text = (REPO / "Dockerfile").read_text()
    assert steps[0] == ("ARG", "BASE_IMAGE=" + build_image.DEFAULT_BASE), "ARG BASE_IMAGE defaults to the DLC"
    assert not any("--mount" in value for name, value in steps if name == "RUN"), "classic builder: no RUN --mount"
    assert not text.startswith("# syntax"), "classic builder only: no BuildKit frontend"
    assert steps[-1] == ("ENTRYPOINT", '["python3", "-m", "entrypoint"]'), "exec-form ENTRYPOINT, last"
    assert ("WORKDIR", "/opt/neuron-qwen3") in steps
    assert ("HEALTHCHECK", "NONE") in steps, "the DLC's leftover health check is switched off"
    user = [value for name, value in steps if name == "USER"]
    assert user and user[-1] not in ("root", "0"), "runs as a non-root user"
    # Layer order: packages (in their own stage), then the code, then metadata, so a code change reinstalls nothing.
    copies = [value for name, value in steps if name == "COPY"]
    code = [
        i for i, (name, value) in enumerate(steps) if name == "COPY" and value.startswith(("entrypoint", "recipes"))
    ]
    venv = next(i for i, (name, value) in enumerate(steps) if name == "COPY" and value.startswith("--from=packages"))
    label = names.index("LABEL")
    assert len(code) == 2 and venv < min(code) and max(code) < label, copies
    assert "--no-deps --require-hashes -r requirements.lock" in (REPO / "ci/image/install-packages.sh").read_text()


def test_context_allowlist_matches_dockerignore():
    allowed = {
        line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line.startswith("!")
    }
    assert allowed == set(build_image.CONTEXT) - {".dockerignore"}, "ci/build_image.py CONTEXT and .dockerignore differ"


def test_hadolint():
    smoke.hadolint()


@pytest.mark.parametrize("ref", ["release-2.33", None, "0123abc"])
def test_the_torchtitan_neuron_fork_is_installed_only_from_a_pinned_commit(tmp_path, ref):
    with pytest.raises(build_image.BuildError, match="needs --torchtitan-neuron-ref=<a 40-hex commit"):
        build_image.prepare_wheelhouse(tmp_path, {}, "neuron", None, ref, None)
    assert list(tmp_path.iterdir()) == []  # refused before anything was fetched
    script = (REPO / "ci" / "image" / "install-packages.sh").read_text()
    assert "grep -Eqx '[0-9a-f]{40}'" in script  # and the online build refuses it too


def test_tags_and_base_slug():
    assert build_image.base_slug(build_image.DEFAULT_BASE) == "sdk2.33.0"
    assert build_image.base_slug("neuron-qwen3-standin:torch2.14.1-abc") == "standin"
    tag = build_image.tags_for(build_image.DEFAULT_BASE, "0123456789abcdef0123-dirty")[0]
    assert re.fullmatch(r"neuron-qwen3:tt0\.3\.0-tf5\.16\.0-sdk2\.33\.0-0123456789ab-dirty", tag), tag
    assert len(tag.split(":", 1)[1]) <= 128


class EngineAt:
    """What check_room asks of a docker client: where the engine keeps its data."""

    def __init__(self, root):
        self.root = str(root)

    def info(self):
        return {"DockerRootDir": self.root}


def test_the_stand_in_is_not_built_on_a_disk_without_room_for_it(tmp_path):
    need = int(shutil.disk_usage(tmp_path).free / 1e9) + 1000
    with pytest.raises(RuntimeError) as refused:
        standin.check_room(EngineAt(tmp_path), need)
    assert re.fullmatch(
        rf"building the stand-in base needs about {need} GB free in {re.escape(str(tmp_path))} "
        r"\(the engine's data root\), \d+\.\d GB are free",
        str(refused.value),
    ), refused.value
    standin.check_room(EngineAt(tmp_path), 0)  # room enough
    standin.check_room(EngineAt(tmp_path / "on-another-host"), need)  # a remote engine's disk is not checked


# ---- the engine, the stand-in and the image: built once for this module ---------------------------


@pytest.fixture(scope="module")
def client():
    with Engine() as engine_client:
        yield engine_client


@pytest.fixture(scope="module")
def base(client):
    return standin.ensure(client)


@pytest.fixture(scope="module")
def image(client, base):
    result = build_image.build(client, base_image=base, hermetic=True)
    smoke.prune_old_images(client, result.image_id)
    return result


@pytest.mark.image
@pytest.mark.parametrize("case", smoke.CASES, ids=lambda case: case.name)
def test_container(client, image, case):
    smoke.check_case(client, image.tags[0], case)


@pytest.mark.image
def test_image_contents(client, image, base):
    smoke.inspect_image(client, image.tags[0], base)


@pytest.mark.image
def test_code_change_rebuilds_fast_without_reinstalling(client, image, base, tmp_path):
    """A changed file in recipes/ re-runs only the steps after `COPY recipes/`; the packages stay cached."""
    context = build_image.copy_context(tmp_path / "context")
    changed = context / "recipes" / "neuron_qwen3" / "__init__.py"
    changed.write_text(changed.read_text() + f"\n# rebuild test {time.time()}\n")
    tag = f"{build_image.NAME}:rebuild-test"
    try:
        result = build_image.build(client, base_image=base, hermetic=True, context=context, tags=[tag])
        ran = [step for step, _, cached in result.steps if not cached]
        install = [step for step, _, cached in result.steps if "install-packages.sh" in step]
        assert install and all(cached for step, _, cached in result.steps if "install-packages.sh" in step), install
        assert not any(
            step.split(" : ", 1)[1].startswith(("RUN sh", "COPY --from", "COPY requirements")) for step in ran
        ), ran
        assert any("COPY recipes/" in step for step in ran), "the recipes/ change was not seen"
        assert result.seconds < 60, f"code-only rebuild took {result.seconds:.0f}s"
    finally:
        client.images.remove(tag, force=True)
