"""The image smoke-test job: build the image on a stand-in base and run it for real.

    python -m ci.smoke            # or `make smoke`; tests/test_image.py runs the same pieces under pytest

1. a Docker engine: the one that answers, else Debian's docker.io started here (ci/engine.py), stopped after;
2. the stand-in base (Debian 12 + Python 3.11 + torch 2.14.1, ci/standin.py), built once and reused, then
   the real Dockerfile on it, hermetic (ci/build_image.py);
3. the container, as a user runs it: CASES below (each variant trains at smoke scale on CPU with a falling
   loss; fake Neuron devices with and without --dry-run; an unknown VARIANT), then IMAGE_CHECKS on the
   image itself (metadata, user, paths, no secrets, torch from the base, size added);
4. hadolint at the error threshold (ci/hadolint.yaml), every ignored rule with its reason inline.
Any failure is a SmokeFailure naming the case (explicit: `python -O` keeps every check); the exit status is 1 if
any failed.
"""

import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from ci import build_image, standin, wheelhouse
from neuron_qwen3.prelaunch import selftest as names  # the log patterns: LOSS_LINE, COLOUR

STEPS = os.environ.get("NQ_SMOKE_STEPS", "4")
NEURON_DEVICES = 4  # x 4 logical cores per trn2 device at LNC 2 = 16 processes
SIZE_BUDGET = 1.5e9  # bytes the image may add on top of its base
HADOLINT_FILES = ("Dockerfile", "ci/standin/Dockerfile")
ANSI = re.compile(names.COLOUR)
LOSS = re.compile(names.LOSS_LINE)


@dataclass(frozen=True)
class Case:
    """One `docker run` of the image and what must come of it."""

    name: str
    env: dict = field(default_factory=dict)
    args: tuple = ()  # after the image name: the launcher's flags
    neuron_devices: int = 0  # --device /dev/null:/dev/neuronN for N < this
    exit_code: int = 0
    loss_falls: bool = False  # stdout+stderr has >= 2 "step: N loss: X" lines, the last loss below the first
    nproc: int | None = None  # stdout is the --dry-run plan, with this many processes
    error: str | None = None  # stderr is exactly one line containing this
    timeout: int = 120  # seconds; a smoke training run takes 15-25 s here
    network: str | None = None  # docker's network mode; None: the default bridge, as users run it
    entrypoint: tuple | None = None  # a command typed by hand instead of the image's launcher
    stdout_has: str | None = None  # stdout contains this


CASES = (
    *(
        Case(
            f"train-{variant}", env={"VARIANT": variant, "SCALE": "smoke", "STEPS": STEPS}, loss_falls=True, timeout=300
        )
        for variant in ("v5", "nki_moe")
    ),
    # native with no network at all: the single-node rendezvous must not need the container's host name to resolve
    Case(
        "train-native-network-none",
        env={"VARIANT": "native", "SCALE": "smoke", "STEPS": STEPS},
        loss_falls=True,
        network="none",
        timeout=300,
    ),
    # the article's hand-typed command, without the launcher, from another directory: the installed recipes train
    # and the config's own trainer leaves the run report
    Case(
        "hand-typed-article-command",
        entrypoint=("sh", "-c"),
        args=(
            "cd / && python3 -m torch.distributed.run --nproc_per_node=1 --rdzv_backend c10d --rdzv_endpoint "
            "127.0.0.1:0 --local-addr 127.0.0.1 -m torchtitan.train --module neuron_qwen3 --config native_qwen3_smoke "
            f"--training.steps {STEPS} --dump_folder /tmp/by-hand && cat /tmp/by-hand/report/summary.json",
        ),
        env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
        network="none",
        loss_falls=True,
        stdout_has='"end": "finished"',
        timeout=300,
    ),
    Case("neuron-dry-run", args=("--dry-run",), neuron_devices=NEURON_DEVICES, nproc=NEURON_DEVICES * 4),
    Case("neuron-without-torch-neuronx", neuron_devices=NEURON_DEVICES, exit_code=2, error="torch_neuronx"),
    Case("unknown-variant", env={"VARIANT": "llama4"}, exit_code=2, error="VARIANT='llama4'"),
)


class SmokeFailure(Exception):
    """A failed check: an explicit exception, not `assert`, so `python -O` cannot switch the checks off."""


def expect(condition, message):
    if not condition:
        raise SmokeFailure(message)


def log(message):
    print(f"[smoke] {message}", file=sys.stderr, flush=True)


# ---- 3. running the container ---------------------------------------------------------------


def run_container(client, image, case):
    """(exit code, stdout, stderr) of one case's container."""
    devices = [f"/dev/null:/dev/neuron{n}:rwm" for n in range(case.neuron_devices)]
    # Default network unless the case says otherwise (smoke runs are offline anyway: HF_HUB_OFFLINE, bundled
    # assets); one case runs with network "none", where the container's host name does not resolve.
    options = {"network_mode": case.network} if case.network else {}
    if case.entrypoint:
        options["entrypoint"] = list(case.entrypoint)
    container = client.containers.run(
        image, list(case.args), environment=case.env, devices=devices, detach=True, shm_size="1g", **options
    )
    try:
        try:
            status = container.wait(timeout=case.timeout)
        except Exception:  # requests' ReadTimeout: the container hangs
            container.kill()
            output = container.logs().decode(errors="replace")
            raise SmokeFailure(
                f"{case.name}: no exit within {case.timeout}s; output (tail):\n{output[-3000:]}"
            ) from None
        return (
            status["StatusCode"],
            container.logs(stdout=True, stderr=False).decode(errors="replace"),
            container.logs(stdout=False, stderr=True).decode(errors="replace"),
        )
    finally:
        container.remove(force=True)


def losses(text):
    return [(int(step), float(loss)) for step, loss in LOSS.findall(ANSI.sub("", text))]


def check_case(client, image, case):
    """Run `case`; raise SmokeFailure with the container's output tail when it does not hold."""
    started = time.monotonic()
    code, out, err = run_container(client, image, case)
    tail = f"\n--- stdout (tail) ---\n{out[-3000:]}\n--- stderr (tail) ---\n{err[-3000:]}"
    expect(code == case.exit_code, f"{case.name}: exit status {code}, expected {case.exit_code}{tail}")
    summary = f"exit {code}"
    if case.loss_falls:
        seen = losses(out + err)
        expect(len(seen) >= 2, f"{case.name}: fewer than 2 loss lines in the output{tail}")
        expect(all(math.isfinite(loss) for _, loss in seen), f"{case.name}: non-finite loss {seen}{tail}")
        expect(seen[-1][1] < seen[0][1], f"{case.name}: loss did not fall: {seen}{tail}")
        summary += ", loss " + " -> ".join(f"{loss:.3f}" for _, loss in seen)
    if case.nproc is not None:
        plan = json.loads(out)
        expect(plan["nproc"] == case.nproc, f"{case.name}: plan has {plan['nproc']} processes, expected {case.nproc}")
        expect(plan["devices"]["kind"] == "neuron", f"{case.name}: plan is for {plan['devices']['kind']}{tail}")
        expect(f"--nproc_per_node={case.nproc}" in plan["argv"], f"{case.name}: argv {plan['argv']}")
        summary += f", plan: {plan['nproc']} processes on {len(plan['devices']['nodes'])} Neuron devices"
    if case.stdout_has is not None:
        expect(case.stdout_has in out, f"{case.name}: {case.stdout_has!r} not in stdout{tail}")
        summary += f", stdout has {case.stdout_has!r}"
    if case.error is not None:
        lines = err.strip().splitlines()
        expect(len(lines) == 1, f"{case.name}: expected a one-line error, got {len(lines)} lines{tail}")
        expect(case.error in lines[0], f"{case.name}: {case.error!r} not in the error line {lines[0]!r}")
        summary += f": {lines[0]}"
    seconds = time.monotonic() - started
    log(f"{case.name}: ok ({seconds:.0f}s) {summary}")
    return summary


# ---- the image itself -------------------------------------------------------------------------

# Run inside the image as its own user: what a layer must not contain, and what the user can write.
# A certificate-like file is allowed only when a wheel installed with --require-hashes shipped it, byte
# for byte (public CA bundles of certifi, pip, grpc): its sha256 must match its distribution's RECORD.
INSPECT = r"""
import base64, hashlib, importlib.metadata as md, json, os, torch
shipped = {}
for dist in md.distributions():
    for f in dist.files or ():
        if f.hash and f.hash.mode == "sha256":
            shipped[os.path.realpath(dist.locate_file(f))] = f.hash.value
def pristine(path):
    digest = base64.urlsafe_b64encode(hashlib.sha256(open(path, "rb").read()).digest()).rstrip(b"=").decode()
    return shipped.get(os.path.realpath(path)) == digest
suspicious = []
for top in ("/opt/neuron-qwen3", "/data", "/home/trainer", "/tmp", "/root", "/etc/pip.conf", "/etc/pip"):
    for dirpath, dirnames, filenames in os.walk(top):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if (name.endswith((".pem", ".crt", ".key", ".p12"))
                    or name in (".netrc", "pip.conf", ".pypirc", ".git-credentials", "token", "credentials")
                    or (name == "config.json" and dirpath.endswith(".docker"))):
                if not pristine(path):
                    suspicious.append(path)
paths = [os.environ[var] for var in ("ASSETS_DIR", "OUTPUT_DIR", "CACHE_DIR")] + ["/data/checkpoints"]
writable = {path: os.access(path, os.W_OK) for path in paths}
print(json.dumps({"uid": os.getuid(), "torch": torch.__file__, "suspicious": suspicious, "writable": writable}))
"""
SECRET_WORDS = re.compile(r"(token|secret|password|passwd|api_?key|credentials?)[a-z_]*=|PRIVATE KEY", re.I)


def inspect_image(client, image, base_image):
    """Image-level checks; returns a dict of what was measured (size added, labels)."""
    attrs = client.images.get(image).attrs
    config = attrs["Config"]
    expect(config["Entrypoint"] == ["python3", "-m", "entrypoint"], f"entrypoint {config['Entrypoint']}")
    expect(config["WorkingDir"] == "/opt/neuron-qwen3", f"workdir {config['WorkingDir']}")
    expect(config["User"] not in ("", "0", "root"), f"runs as root ({config['User']!r})")
    expect((config.get("Healthcheck") or {}).get("Test") == ["NONE"], f"healthcheck {config.get('Healthcheck')}")
    labels = config["Labels"] or {}
    pins = {r.name: r.version for r in wheelhouse.parse_lock(REPO / "requirements.lock")}
    expected = {
        "io.neuron-qwen3.torchtitan.version": pins["torchtitan"],
        "io.neuron-qwen3.transformers.version": pins["transformers"],
        "org.opencontainers.image.base.name": base_image,
    }
    for key, value in expected.items():
        expect(labels.get(key) == value, f"label {key}={labels.get(key)!r}, expected {value!r}")
    for key in (
        "org.opencontainers.image.revision",
        "org.opencontainers.image.created",
        "io.neuron-qwen3.torch.version",
    ):
        expect(labels.get(key) not in (None, "", "unknown"), f"label {key} is {labels.get(key)!r}")

    # No secret in any layer: nothing token-like in the build steps or the environment...
    history = [step.get("CreatedBy", "") for step in client.api.history(image)]
    base_history = {step.get("CreatedBy", "") for step in client.api.history(base_image)}
    ours = [step for step in history if step not in base_history]
    base_env = set(client.images.get(base_image).attrs["Config"]["Env"] or ())
    leaks = [step for step in ours + [e for e in config["Env"] if e not in base_env] if SECRET_WORDS.search(step)]
    expect(not leaks, f"secret-like words in the image's build steps or environment: {leaks}")
    # ...and no key, certificate or credentials file in the paths the image's layers write.
    out = client.containers.run(image, ["-c", INSPECT], entrypoint="python3", network_mode="none", remove=True)
    seen = json.loads(out.decode().strip().splitlines()[-1])
    expect(not seen["suspicious"], f"key/certificate/credential files no hashed wheel shipped: {seen['suspicious']}")
    expect(seen["uid"] != 0, "the container runs as root")
    expect(all(seen["writable"].values()), f"data paths not writable by the image's user: {seen['writable']}")
    expect("/opt/neuron-qwen3/venv/" not in seen["torch"], f"torch comes from the image's venv: {seen['torch']}")

    added = attrs["Size"] - client.images.get(base_image).attrs["Size"]
    expect(added < SIZE_BUDGET, f"the image adds {added / 1e9:.2f} GB to its base (budget {SIZE_BUDGET / 1e9} GB)")
    log(f"image: ok; adds {added / 1e6:.0f} MB to its base; user {config['User']}; torch from {seen['torch']}")
    return {"added_bytes": added, "labels": labels, "user": config["User"]}


# ---- 4. hadolint ------------------------------------------------------------------------------

IGNORE = re.compile(r"#\s*hadolint\s+ignore=(\S+)(.*)")


def hadolint():
    """hadolint at the error threshold; every inline ignore must say why on the same line."""
    exe = Path(sys.executable).parent / "hadolint"
    done = subprocess.run(
        [str(exe), "--config", "ci/hadolint.yaml", *HADOLINT_FILES], cwd=REPO, capture_output=True, text=True
    )
    expect(done.returncode == 0, f"hadolint failed:\n{done.stdout}{done.stderr}")
    for name in HADOLINT_FILES:
        lines = (REPO / name).read_text().splitlines()
        for number, line in enumerate(lines, 1):
            match = IGNORE.search(line)
            if match:  # the reason: after the rule list, or the comment line just above
                above = lines[number - 2].strip() if number > 1 else ""
                reason = match[2].strip(" :-") or (above.lstrip("# ") if above.startswith("#") else "")
                expect(len(reason) >= 10, f"{name}:{number}: hadolint ignore={match[1]} without a reason")
    config = (REPO / "ci" / "hadolint.yaml").read_text()
    for line in config.splitlines():
        if re.match(r"\s*-\s*(DL|SC)\d+", line):
            expect("#" in line, f"ci/hadolint.yaml: ignored rule without a reason: {line.strip()}")
    log(f"hadolint: clean ({', '.join(HADOLINT_FILES)})")


# ---- the job ------------------------------------------------------------------------------------


def prune_old_images(client, keep):
    """Remove neuron-qwen3 images other than `keep` (each is 0.7 GB of unique layers)."""
    for image in client.images.list(name=build_image.NAME):
        if image.id != keep:
            client.images.remove(image.id, force=True)
    # untagged earlier builds (their tags moved on); the untagged `packages` stage images carry no such
    # label and stay: they are the build cache of the package layer
    client.images.prune(filters={"dangling": True, "label": "org.opencontainers.image.title=neuron-qwen3"})


def main():
    from ci.engine import Engine

    started = time.monotonic()
    failures = []
    try:
        hadolint()
    except SmokeFailure as error:
        failures.append(str(error))
        log(f"hadolint: FAILED\n{error}")
    with Engine() as client:
        base = standin.ensure(client)
        result = build_image.build(client, base_image=base, hermetic=True)
        image = result.tags[0]
        prune_old_images(client, result.image_id)
        for case in CASES:
            try:
                check_case(client, image, case)
            except SmokeFailure as error:
                failures.append(str(error))
                log(f"{case.name}: FAILED\n{error}")
        try:
            inspect_image(client, image, base)
        except SmokeFailure as error:
            failures.append(str(error))
            log(f"image: FAILED\n{error}")
    log(
        f"{'FAILED' if failures else 'passed'}: {len(CASES) + 2 - len(failures)} of {len(CASES) + 2} checks "
        f"in {time.monotonic() - started:.0f}s"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
