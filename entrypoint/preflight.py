"""The launcher's checks, after the plan and before torchrun, one line each (docs/production.md, "Preflight").

Stdlib only: the checks that need a file format or the config run in children with the real libraries (the
assets: neuron_qwen3/hf/fetch.py; the rest: `recipes_pass`, neuron_qwen3/prelaunch/preflight.py).
"""

import glob
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
from contextlib import suppress
from dataclasses import dataclass
from functools import partial

from entrypoint.contract import Settings
from entrypoint.hygiene import child_env
from entrypoint.discovery import PHYSICAL_CORES_PER_DEVICE
from entrypoint.plan import CACHE_VARS as CACHE_VARS_BY_KIND
from entrypoint.plan import Plan
from entrypoint.values import mix_parts
from entrypoint.variants import RECIPE_MODULE

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # the locks; in the image, image-build.lock too

SHM_MIN_BYTES = 1 << 30
NOFILE_MIN = 65536
MANY_PROCESSES = 16  # below it, the 65536 open files that 64 ranks need cannot matter
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt")
CACHE_VARS = sorted({name for per_kind in CACHE_VARS_BY_KIND.values() for name in per_kind})


@dataclass(frozen=True)
class Finding:
    fatal: bool
    text: str


fail, warn = partial(Finding, True), partial(Finding, False)


def runtime(plan: Plan, find_spec=importlib.util.find_spec) -> list:
    if plan.devices.kind == "neuron" and find_spec("torch_neuronx") is None:
        return [
            fail(
                f"{len(plan.devices.nodes)} Neuron devices found but the torch_neuronx package is not "
                "installed: run the Neuron image, or pass --dry-run to only print the plan"
            )
        ]
    return []


def compiler_lnc(flags) -> str | None:
    """The LNC the compiler flags ask for: `--lnc=N`, `--lnc N`, `--logical-nc-config[=| ]N`; the last wins."""
    found, words = None, list(flags or ())
    for i, word in enumerate(words):
        name, equals, value = word.partition("=")
        if name in ("--lnc", "--logical-nc-config"):
            found = value if equals else (words[i + 1] if i + 1 < len(words) else "")
    return found


def lnc(plan: Plan, settings: Settings) -> list:
    wanted = compiler_lnc(settings.neuron_cc_flags)
    if plan.devices.kind != "neuron" or wanted is None or wanted == str(settings.neuron_logical_nc_config):
        return []
    return [
        fail(
            f"NEURON_CC_FLAGS compiles for --lnc={wanted} but NEURON_LOGICAL_NC_CONFIG="
            f"{settings.neuron_logical_nc_config}: the compiler and the runtime must agree"
        )
    ]


def held_cores(plan: Plan) -> list:
    """Processes neuron-ls shows on the devices this run will use (all, or those of NEURON_RT_VISIBLE_CORES)."""
    devices = plan.devices
    if devices.kind != "neuron" or not devices.held:
        return []
    if devices.visible_cores is None:
        used = set(devices.nodes)
    else:  # logical core c sits on device c // (logical cores per device)
        per_device = PHYSICAL_CORES_PER_DEVICE // (devices.lnc or 2)
        used = {f"neuron{core // per_device}" for core in devices.visible_cores}
    busy = [(node, pid, command) for node, pid, command in devices.held if node in used]
    if not busy:
        return []
    shown = ", ".join(f"{node} (pid {pid} {command})" for node, pid, command in busy[:4])
    more = f" and {len(busy) - 4} more" if len(busy) > 4 else ""
    return [
        fail(
            f"NeuronCores are in use by another process: {shown}{more}: stop it, or choose free cores "
            "with NEURON_RT_VISIBLE_CORES"
        )
    ]


def limits(root="/", processes=MANY_PROCESSES, getrlimit=resource.getrlimit, setrlimit=resource.setrlimit) -> list:
    """/dev/shm size, open files (raised to the hard limit first: children inherit it; a warning only with many
    processes on this node), locked memory with EFA."""
    findings = []
    try:
        stat = os.statvfs(os.path.join(root, "dev", "shm"))
        size = stat.f_blocks * stat.f_frsize
        if size < SHM_MIN_BYTES:
            findings.append(
                warn(
                    f"/dev/shm is {size >> 20} MiB, below {SHM_MIN_BYTES >> 20} MiB: dataloader workers "
                    "and gloo may fail; docker run --shm-size=16g (or --ipc=host), a memory-backed "
                    "emptyDir on Kubernetes"
                )
            )
    except OSError:
        findings.append(warn("no /dev/shm: mount one (docker run --shm-size=16g)"))
    soft, hard = getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < NOFILE_MIN:
        target = NOFILE_MIN if hard == resource.RLIM_INFINITY or hard >= NOFILE_MIN else hard
        if target > soft:
            with suppress(ValueError, OSError):
                setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
        if soft < NOFILE_MIN and processes >= MANY_PROCESSES:
            findings.append(
                warn(
                    f"open-file limit (nofile) is {soft}, below {NOFILE_MIN}: many ranks fail with "
                    "'Too many open files'; docker run --ulimit nofile=65536:65536"
                )
            )
    efa = bool(glob.glob(os.path.join(glob.escape(root), "dev", "infiniband", "uverbs*")))
    memlock = getrlimit(resource.RLIMIT_MEMLOCK)[0]
    if efa and memlock != resource.RLIM_INFINITY:
        findings.append(
            warn(
                f"EFA devices are present but locked memory is limited to {memlock >> 10} KiB: "
                "EFA needs it unlimited (docker run --ulimit memlock=-1)"
            )
        )
    return findings


def _writable(path):
    """None if the run can write in `path`, else what is wrong, as a phrase. Creates nothing: a missing folder is
    judged by the nearest folder above it that exists (the run makes the rest), so a failed or `--check` preflight
    leaves no trace."""
    path = os.path.abspath(path)
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return "is a file, not a folder" if existing == path else f"is below {existing}, which is a file"
    if existing != path:
        return None if os.access(existing, os.W_OK | os.X_OK) else f"cannot be made: {existing} is not writable"
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".preflight-")
        os.close(fd)
        os.unlink(probe)
        return None
    except OSError as error:
        return f"is not writable: {error.strerror or type(error).__name__}"


def writable(plan: Plan, settings: Settings, environ) -> list:
    """Every directory the run writes: compile caches (as the workers will see them), checkpoints, outputs (the
    assets folder: the fetch child's)."""
    env = {**environ, **plan.env}
    dirs = [(name, env[name]) for name in CACHE_VARS if name in env and "://" not in env[name]]
    dirs += [("CHECKPOINT_DIR", plan.checkpoint_dir)] if plan.checkpoint_dir else []
    dirs += [("OUTPUT_DIR", settings.output_dir)]
    return [
        fail(
            f"{path} ({name}) {why}; mount a writable volume at "
            f"{'CACHE_DIR' if name in CACHE_VARS and name not in environ else name}"
        )
        for name, path in dirs
        if (why := _writable(path))
    ]


def fetch_argv(plan: Plan, settings: Settings, check=False) -> list:
    """The asset child (index, huggingface_hub: not stdlib): what the folder lacks, fetched, or why it cannot be."""
    return [
        sys.executable,
        "-m",
        f"{RECIPE_MODULE}.hf.fetch",
        plan.model,
        plan.assets,
        *["--weights"] * (settings.init_from == "hub"),
        *["--offline"] * settings.hf_hub_offline,
        *["--check"] * check,
    ]


def dataset(settings: Settings) -> list:
    name = settings.dataset
    offline = settings.hf_hub_offline or settings.scale != "full"
    if not name or name == "c4" and not offline:
        return []
    parts = mix_parts(name)
    if parts:
        missing = [path for path, _ in parts if not os.path.exists(path)]
        return (
            [fail(f"DATASET={name!r}: {missing[0]} does not exist (a mix takes local files and folders)")]
            if missing
            else []
        )
    local = os.path.exists(name) or name.endswith(DATA_SUFFIXES) or name.startswith(("/", ".", "~"))
    if local and not os.path.exists(name):
        return [fail(f"DATASET={name!r} does not exist")]
    if not local and offline:
        return [
            fail(
                f"DATASET={name!r} is a Hub dataset but the run is offline (HF_HUB_OFFLINE=1 or SCALE="
                f"{settings.scale}): give a local .jsonl, .json, .parquet or .txt file"
            )
        ]
    return []


def run(plan: Plan, settings: Settings, environ, root="/") -> list:
    """Every stdlib check, in order; the caller prints them and stops on a fatal one (unless PREFLIGHT=warn)."""
    return [
        *runtime(plan),
        *lnc(plan, settings),
        *held_cores(plan),
        *limits(root, plan.nproc),
        *writable(plan, settings, environ),
        *dataset(settings),
    ]


def request(plan: Plan, print_config=False, check_files=True, fix=False) -> dict:
    """What the recipes' pre-launch pass is asked (neuron_qwen3/prelaunch/preflight.py). `fix`: node 0 moves broken
    checkpoints aside."""
    return {
        "args": list(plan.worker_args),
        "model": plan.model,
        "variant": plan.variant,
        "locks": REPO,
        "ranks": plan.nproc * plan.rendezvous.nnodes,
        "print_config": print_config,
        "check_files": check_files,
        "fix_checkpoints": fix,
        "node_rank": plan.rendezvous.node_rank,
    }


def recipes_pass(plan: Plan, environ, **asked):
    """(findings, answer) of the recipes' pre-launch pass over the workers' exact arguments, in a child
    interpreter (it imports torch and torchtitan: seconds)."""
    env = {**child_env(environ), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", f"{RECIPE_MODULE}.prelaunch.preflight"],
        input=json.dumps(request(plan, **asked)),
        capture_output=True,
        text=True,
        env=env,
    )
    try:
        answer = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return [fail(f"the pre-launch pass failed (exit {result.returncode}): {tail}")], {}
    return [*map(fail, answer["problems"]), *map(warn, answer["warnings"])], answer
