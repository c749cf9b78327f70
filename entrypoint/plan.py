"""Settings + devices -> one torchrun command and the environment it adds: everything a launch will do.

The command is the article's single-node launch, run through this interpreter so no PATH lookup is needed,
plus the rendezvous of a multi-node job (rendezvous.py) and the checkpoint flags when CHECKPOINT_DIR is set;
`--dry-run` prints the plan instead of running it. Nothing here touches the filesystem.
"""

import os
import sys
from dataclasses import dataclass

from entrypoint import rendezvous
from entrypoint.contract import Settings, UsageError
from entrypoint.discovery import Devices
from entrypoint.variants import RECIPE_MODULE, VARIANTS

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
RECIPES = os.path.join(REPO, "recipes")
# Every worker ends in neuron_qwen3.trainer (torchtitan's main with the project's run hooks); the CPU worker
# applies the CPU adapter, the Neuron worker imports torch_neuronx, before torchtitan is imported.
WORKER = {"neuron": "neuron_qwen3.neuron_worker", "cuda": "neuron_qwen3.trainer", "cpu": "neuron_qwen3.cpu_worker"}
COMPILE_BACKEND = {"neuron": "neuron", "cuda": "inductor", "cpu": "inductor"}
UNIT = {"neuron": "logical NeuronCores", "cuda": "GPUs", "cpu": "CPU cores"}


@dataclass(frozen=True)
class Plan:
    variant: str
    scale: str
    module: str
    config: str
    devices: Devices
    nproc: int
    argv: tuple
    env: dict  # additions to the launcher's own environment
    rendezvous: rendezvous.Rendezvous
    assets: str | None  # full scale: the folder --hf_assets_path names; smoke: None (bundled)
    checkpoint_dir: str | None  # absolute; None: no checkpoints


def process_count(settings: Settings, devices: Devices, rdzv: rendezvous.Rendezvous) -> int:
    name, nproc = ("NPROC", settings.nproc) if settings.nproc else ("PET_NPROC_PER_NODE", rdzv.nproc_per_node)
    nproc = nproc or (1 if devices.kind == "cpu" else devices.count)
    if nproc > devices.count:
        raise UsageError(f"{name}={nproc} is more than the {devices.count} {UNIT[devices.kind]} found "
                         f"(allowed: 1-{devices.count})")
    return nproc


def assets_path(settings: Settings) -> str | None:
    """Where the full-scale assets of the variant live: $ASSETS_DIR/<repo name>, as `hf download --local-dir`."""
    if settings.scale != "full":  # smoke configs carry their own bundled assets
        return None
    return os.path.join(settings.assets_dir, VARIANTS[settings.variant].hf_repo.rsplit("/", 1)[-1])


def checkpoint_args(settings: Settings) -> list:
    """Save every CHECKPOINT_INTERVAL steps into CHECKPOINT_DIR; torchtitan resumes from the newest step-N there.

    The last checkpoint keeps the optimizer (`no-last-save-model-only`) so that a finished run can be restarted
    with more steps; checkpoints.py has already moved aside any step-N a restart must not load.
    """
    if not settings.checkpoint_dir:
        return []
    return ["--checkpoint.enable", "--checkpoint.folder", os.path.abspath(settings.checkpoint_dir),
            "--checkpoint.interval", str(settings.checkpoint_interval),
            "--checkpoint.keep_latest_k", str(settings.checkpoint_keep), "--checkpoint.no-last-save-model-only"]


def torchtitan_args(settings: Settings, kind: str) -> list:
    args = ["--training.steps", str(settings.steps)] if settings.steps else []
    if settings.compile:
        args += ["--compile.enable", "--compile.backend", COMPILE_BACKEND[kind]]
    assets = assets_path(settings)
    if assets:
        args += ["--hf_assets_path", assets]
        if VARIANTS[settings.variant].hf_config_arg:  # the model's config.json from the same folder, not the Hub
            args += [VARIANTS[settings.variant].hf_config_arg, assets]
    return args + checkpoint_args(settings) + ["--dump_folder", settings.output_dir, *settings.extra_args]


def cache_dirs(settings: Settings, kind: str) -> dict:
    """The compile-cache variables, each in its own folder under CACHE_DIR/<variant>/ (absolute: compilers run in
    their own working directories). Variants compile different graphs, so they never share a folder."""
    cache = os.path.join(os.path.abspath(settings.cache_dir), settings.variant)
    if kind == "neuron":
        return {"TORCH_NEURONX_NEFF_CACHE_DIR": f"{cache}/neff", "TORCH_NEURONX_HLO_CACHE_DIR": f"{cache}/hlo",
                "NKI_COMPILE_CACHE_URL": f"{cache}/nki"}
    return {"TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor"}


def env_additions(settings: Settings, devices: Devices, nproc: int, environ) -> dict:
    # The recipes, and the repository for the stdlib modules the workers share with the launcher (entrypoint.names).
    env = {"PYTHONPATH": os.pathsep.join(filter(None, (RECIPES, REPO, environ.get("PYTHONPATH")))),
           "PYTHONUNBUFFERED": "1"}
    defaults = cache_dirs(settings, devices.kind)
    if devices.kind == "neuron":
        env["NEURON_LOGICAL_NC_CONFIG"] = settings.neuron_logical_nc_config
        if "NEURON_RT_VISIBLE_CORES" in environ:
            env["NEURON_RT_VISIBLE_CORES"] = environ["NEURON_RT_VISIBLE_CORES"]
    else:
        env["NEURON_QWEN3_DEVICE"] = devices.kind
        if devices.kind == "cpu":
            defaults["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    if settings.scale == "smoke":  # smoke runs never touch the network
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    if settings.max_restarts:
        # torchrun keeps one rendezvous store across worker restarts by default, and restarted gloo workers then
        # read their peers' addresses from the failed attempt ("Gloo connectFullMesh failed ... Connection
        # refused"; pytorch/pytorch#135712): a store per attempt avoids it.
        defaults["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env.update({name: value for name, value in defaults.items() if name not in environ})
    return env


def build(settings: Settings, devices: Devices, environ) -> Plan:
    config = VARIANTS[settings.variant].configs[settings.scale]
    rdzv = rendezvous.resolve(settings)
    nproc = process_count(settings, devices, rdzv)
    restarts = [f"--max-restarts={settings.max_restarts}"] if settings.max_restarts else []
    argv = (sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", *rdzv.torchrun_args(),
            *restarts, "--local-ranks-filter", "0", "--role", "rank", "--tee", "3",
            "-m", WORKER[devices.kind], "--module", RECIPE_MODULE, "--config", config,
            *torchtitan_args(settings, devices.kind))
    checkpoint_dir = os.path.abspath(settings.checkpoint_dir) if settings.checkpoint_dir else None
    return Plan(settings.variant, settings.scale, RECIPE_MODULE, config, devices, nproc, argv,
                env_additions(settings, devices, nproc, environ), rdzv, assets_path(settings), checkpoint_dir)
