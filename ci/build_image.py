"""Build the neuron-qwen3 image through the docker SDK (what `make image` runs).

    python -m ci.build_image                                  # hermetic, on the Neuron 2.33 DLC
    python -m ci.build_image --base-image neuron-qwen3-standin:torch2.14.1-...   # on another base
    python -m ci.build_image --online                         # pip in the build reaches the index
    python -m ci.build_image --torchtitan neuron --torchtitan-neuron-wheel dist/torchtitan-....whl

Hermetic (the default): the wheels of requirements.lock for the base image's own Python (probed by
running it) are downloaded on the host into .wheelhouse/, sent with the build context, and the
build runs with no network at all (network mode "none"): it works on air-gapped hosts and behind
TLS-intercepting proxies, and needs no credentials or CA in any layer.

Tags: neuron-qwen3:tt<torchtitan>-tf<transformers>-<base>-<git revision>, and neuron-qwen3:latest.
Labels: the OCI ones (revision, created, version, base.name) and the pinned versions.
"""

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from ci import wheelhouse

NAME = "neuron-qwen3"
DEFAULT_BASE = "public.ecr.aws/neuron/pytorch-training-neuronx:2.14.0-neuronx-py314-sdk2.33.0-ubuntu26.04"
# The torchtitan-neuron fork is installed only from a pinned commit (a branch moves under a rebuild) or from a wheel
# file the user supplies; its commit could not be looked up here, so there is no default: --torchtitan-neuron-ref.
COMMIT = re.compile(r"[0-9a-f]{40}")
# What the build context holds (the allowlist of .dockerignore; tests/test_image.py checks they agree).
CONTEXT = (
    "Dockerfile",
    ".dockerignore",
    "requirements.lock",
    "requirements-torch.lock",
    "pyproject.toml",
    "ci/image",
    ".wheelhouse",
    "entrypoint",
    "recipes",
)
LOCK = REPO / "requirements.lock"
TORCH_LOCK = REPO / "requirements-torch.lock"


class BuildError(RuntimeError):
    pass


@dataclass
class BuildResult:
    image_id: str
    tags: list
    seconds: float
    steps: list = field(default_factory=list)  # (step line, seconds, cached)

    @property
    def cached_steps(self):
        return sum(1 for *_, cached in self.steps if cached)


def stream_build(client, out=sys.stderr, **kwargs):
    """Run one build, printing its output as it comes with each step's duration; returns a BuildResult."""
    started = step_started = time.monotonic()
    steps, lines, image_id = [], [], None
    current = None

    def close_step():
        if current is not None:
            steps.append((current[0], time.monotonic() - step_started, current[1]))

    kwargs.setdefault("rm", True)
    kwargs.setdefault("forcerm", True)
    kwargs.setdefault("pull", False)
    for chunk in client.api.build(decode=True, use_config_proxy=False, **kwargs):
        if "error" in chunk:
            print(chunk["error"], file=out, flush=True)
            lines.append(chunk["error"])
            raise BuildError(f"build failed: {chunk['error'].strip()}\n" + "".join(lines[-40:]))
        if "aux" in chunk and "ID" in chunk["aux"]:
            image_id = chunk["aux"]["ID"]
        text = chunk.get("stream") or chunk.get("status") or ""
        if not text:
            continue
        lines.append(text if text.endswith("\n") else text + "\n")
        if text.startswith("Step "):
            close_step()
            current = [text.strip(), False]
            step_started = time.monotonic()
            print(f"[{time.monotonic() - started:6.1f}s] {text.rstrip()}", file=out, flush=True)
            continue
        if current is not None and "Using cache" in text:
            current[1] = True
        print(text, end="" if text.endswith("\n") else "\n", file=out, flush=True)
    close_step()
    if image_id is None:
        raise BuildError("the build ended without an image ID:\n" + "".join(lines[-40:]))
    tags = [kwargs["tag"]] if kwargs.get("tag") else []
    result = BuildResult(image_id, tags, time.monotonic() - started, steps)
    print(
        f"[{result.seconds:6.1f}s] built {image_id[:19]}: {len(steps)} steps, {result.cached_steps} from cache",
        file=out,
        flush=True,
    )
    return result


def copy_context(dest):
    """A copy of the build context in `dest` (wheels hard-linked): to build from a tree that differs from the repo."""
    dest = Path(dest)
    for name in CONTEXT:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(
                source,
                dest / name,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                copy_function=os.link if name == ".wheelhouse" else shutil.copy2,
            )
        elif source.exists():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def pinned_versions():
    pins = {r.name: r.version for r in wheelhouse.parse_lock(LOCK)}
    return pins["torchtitan"], pins["transformers"]


def git_revision():
    """Full commit id, '-dirty' when the tree differs from it; 'uncommitted' before the first commit."""

    def git(*args):
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)

    head = git("rev-parse", "HEAD")
    if head.returncode:
        return "uncommitted"
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + ("-dirty" if dirty else "")


def base_slug(base_image):
    """sdk2.33.0 for a DLC tag, else the base's short name (standin, ...)."""
    sdk = re.search(r"sdk(\d+(?:\.\d+)*)", base_image)
    if sdk:
        return f"sdk{sdk[1]}"
    name = base_image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]
    return re.sub(r"[^a-z0-9.]+", "-", name.removeprefix(f"{NAME}-").lower())[:32]


def tags_for(base_image, revision):
    torchtitan, transformers = pinned_versions()
    short = "norev" if revision == "uncommitted" else revision[:12] + ("-dirty" if revision.endswith("-dirty") else "")
    return [f"{NAME}:tt{torchtitan}-tf{transformers}-{base_slug(base_image)}-{short}", f"{NAME}:latest"]


def ensure_base(client, base_image, out):
    try:
        return client.images.get(base_image)
    except Exception:  # not here yet: pull it (the DLC is public)
        print(f"pulling {base_image}", file=out, flush=True)
        try:
            return client.images.pull(base_image)
        except Exception as error:
            raise BuildError(f"base image {base_image} is neither on this engine nor pullable: {error}") from None


def prepare_wheelhouse(dest, target, torchtitan, neuron_wheel, neuron_ref, out):
    if torchtitan == "neuron" and not neuron_wheel and not COMMIT.fullmatch(neuron_ref or ""):
        raise BuildError(
            f"--torchtitan neuron needs --torchtitan-neuron-ref=<a 40-hex commit of "
            f"aws-neuron/torchtitan-neuron> (a pinned build), not {neuron_ref!r}; or "
            "--torchtitan-neuron-wheel=<a wheel you built>"
        )
    requirements = wheelhouse.parse_lock(LOCK)
    if not target["triton"]:  # see ci/image/install-packages.sh: torchtitan imports triton
        requirements += [r for r in wheelhouse.parse_lock(TORCH_LOCK) if r.name == "triton"]
    wheelhouse.prepare(requirements, target, dest, log=lambda m: print(m, file=out, flush=True))
    for stale in dest.glob("torchtitan*neuron*.whl"):
        stale.unlink()
    if torchtitan == "neuron":
        if neuron_wheel:
            shutil.copy2(neuron_wheel, dest)
        else:
            source = f"git+https://github.com/aws-neuron/torchtitan-neuron@{neuron_ref}"
            done = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dest), source],
                capture_output=True,
                text=True,
            )
            if done.returncode:
                raise BuildError(
                    f"could not build the torchtitan-neuron wheel from {source} (pass "
                    f"--torchtitan-neuron-wheel instead):\n{done.stderr[-2000:]}"
                )


def build(
    client,
    base_image=DEFAULT_BASE,
    hermetic=True,
    torchtitan="pypi",
    neuron_ref=None,
    neuron_wheel=None,
    nocache=False,
    extra_tags=(),
    tags=None,
    context=REPO,
    out=sys.stderr,
):
    """Build the image on `client` from `context` (the repo, or a copy_context() of it); returns a BuildResult
    whose tags (default: tags_for() the base and the git revision) are all applied."""
    context = Path(context)
    started = time.monotonic()
    ensure_base(client, base_image, out)
    target = wheelhouse.probe(client, base_image)
    print(
        f"base {base_image}: Python {target['python_full_version']}, torch {target['torch']}, "
        f"torch-neuronx {target['torch_neuronx']}, triton {'yes' if target['triton'] else 'no'}",
        file=out,
        flush=True,
    )
    if not target["torch"]:
        raise BuildError(f"base image {base_image} has no torch: use the Neuron DLC or the stand-in (ci/standin.py)")
    if hermetic:
        prepare_wheelhouse(context / ".wheelhouse", target, torchtitan, neuron_wheel, neuron_ref, out)
    elif (context / ".wheelhouse").exists():
        shutil.rmtree(context / ".wheelhouse")  # an online build must not pick up wheels of a hermetic one
    revision = git_revision()
    tags = list(tags or tags_for(base_image, revision)) + list(extra_tags)
    torchtitan_version, transformers_version = pinned_versions()
    buildargs = {
        "BASE_IMAGE": base_image,
        "PIP_OFFLINE": "1" if hermetic else "0",
        "TORCHTITAN": torchtitan,
        "TORCHTITAN_NEURON_REF": neuron_ref or "",
        "VCS_REF": revision,
        "BUILD_DATE": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "TORCHTITAN_VERSION": torchtitan_version,
        "TRANSFORMERS_VERSION": transformers_version,
        "TORCH_VERSION": target["torch"],
        "NEURON_SDK": (re.search(r"sdk(\d+(?:\.\d+)*)", base_image) or [None, "none"])[1],
    }
    result = stream_build(
        client,
        out=out,
        path=str(context),
        dockerfile="Dockerfile",
        tag=tags[0],
        buildargs=buildargs,
        nocache=nocache,
        network_mode="none" if hermetic else None,
    )
    for ref in tags[1:]:
        repository, _, image_tag = ref.rpartition(":")
        client.api.tag(result.image_id, repository, image_tag)
    result.tags = tags
    result.seconds = time.monotonic() - started
    print(f"tagged {', '.join(tags)} ({result.seconds:.0f}s with the wheelhouse)", file=out, flush=True)
    return result


def main(argv=None):
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--base-image", default=DEFAULT_BASE, help="the image to build on (default: the 2.33 DLC)")
    cli.add_argument("--online", action="store_true", help="let pip in the build use the index (no wheelhouse)")
    cli.add_argument(
        "--torchtitan",
        choices=("pypi", "neuron"),
        default="pypi",
        help="pypi: torchtitan 0.3.0 from the lock; neuron: also the torchtitan-neuron fork",
    )
    cli.add_argument("--torchtitan-neuron-ref", help="the fork's commit (40 hex) for --torchtitan neuron")
    cli.add_argument("--torchtitan-neuron-wheel", help="a wheel of the fork built elsewhere (hermetic builds)")
    cli.add_argument("--tag", action="append", default=[], help="an extra tag (repeatable)")
    cli.add_argument("--no-cache", action="store_true")
    args = cli.parse_args(argv)

    from ci.engine import Engine

    with Engine() as client:
        try:
            result = build(
                client,
                args.base_image,
                hermetic=not args.online,
                torchtitan=args.torchtitan,
                neuron_ref=args.torchtitan_neuron_ref,
                neuron_wheel=args.torchtitan_neuron_wheel,
                nocache=args.no_cache,
                extra_tags=args.tag,
            )
        except BuildError as error:
            print(f"build_image: {error}", file=sys.stderr)
            return 1
    print(result.tags[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
