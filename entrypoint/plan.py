"""Settings + devices -> one torchrun command and the environment it adds: everything a launch will do.

The article's `torchrun ... -m torchtitan.train --module neuron_qwen3 --config <fn>`, through this interpreter,
with every setting as the torchtitan flag the contract names. Nothing here touches the filesystem.
"""

import os
import sys
from dataclasses import dataclass

from entrypoint import rendezvous
from entrypoint.contract import VARS, Settings, UsageError
from entrypoint.discovery import Devices
from entrypoint.values import mix_parts
from entrypoint.variants import RECIPE_MODULE, VARIANTS

COMPILE_BACKEND = {"neuron": "neuron", "cuda": "inductor", "cpu": "inductor"}
UNIT = {"neuron": "logical NeuronCores", "cuda": "GPUs", "cpu": "CPU cores"}
# torchtitan flags whose value the launcher owns (it acts on it: housekeeping, folders, devices): the variable.
OWNED_FLAGS = {
    "module": "MODULE",
    "config": "CONFIG (or VARIANT and SCALE)",
    "dump_folder": "OUTPUT_DIR",
    "checkpoint.enable": "CHECKPOINT_DIR",
    "checkpoint.folder": "CHECKPOINT_DIR",
    "checkpoint.keep_latest_k": "CHECKPOINT_KEEP",
    "checkpoint.interval": "CHECKPOINT_INTERVAL",
    "hf_assets_path": "ASSETS_DIR (and MODEL)",
    "device": "DEVICE",
    "neuron.logical_nc_config": "NEURON_LOGICAL_NC_CONFIG",
    "comm.train_timeout_seconds": "PEER_TIMEOUT",
}
# Variables whose flags depend on other settings: built by the functions below, not passed as they are.
BUILT = ("CHECKPOINT_INTERVAL", "CHECKPOINT_KEEP", "ASSETS_DIR", "OUTPUT_DIR", "CONFIG", "MODULE", "WANDB_MODE")
TOKEN_CACHE = "tokens"  # CACHE_DIR/tokens: the data's token cache, shared by every variant (no compiled graphs)
# Made absolute (data when a local path): workers start elsewhere.
PATHS = ("EXPORT_DIR", "DATASET", "VALIDATION", "SAMPLE_PROMPTS", "DPO_REFERENCE")


@dataclass(frozen=True)
class Plan:
    variant: str
    scale: str
    model: str | None  # the Hub id at full scale; None: smoke's bundled model, or CONFIG's own
    module: str
    config: str
    devices: Devices
    nproc: int
    argv: tuple
    env: dict  # additions to the launcher's own environment
    rendezvous: rendezvous.Rendezvous
    assets: str | None  # full scale: the folder --hf_assets_path names; smoke: None (bundled)
    checkpoint_dir: str | None  # absolute; None: no checkpoints

    @property
    def worker_args(self) -> tuple:
        """The torchtitan arguments every worker gets: `--module ... --config ... <flags>`."""
        return self.argv[self.argv.index("torchtitan.train") + 1 :]


def process_count(settings: Settings, devices: Devices, rdzv: rendezvous.Rendezvous) -> int:
    name, nproc = ("NPROC", settings.nproc) if settings.nproc else ("PET_NPROC_PER_NODE", rdzv.nproc_per_node)
    nproc = nproc or (1 if devices.kind == "cpu" else devices.count)
    if nproc > devices.count:
        raise UsageError(
            f"{name}={nproc} is more than the {devices.count} {UNIT[devices.kind]} found (allowed: 1-{devices.count})"
        )
    return nproc


def model_for(settings: Settings) -> str | None:
    """MODEL, else the variant's; None at smoke and bench scale (bundled models) and with CONFIG."""
    if settings.config:
        if settings.model:
            raise UsageError(
                f"MODEL={settings.model!r} and CONFIG={settings.config!r} exclude each other: the "
                "config function decides the model"
            )
        return None
    if settings.scale != "full":
        if settings.model:
            raise UsageError(
                f"MODEL={settings.model!r} is for SCALE=full; SCALE={settings.scale} trains a bundled model"
            )
        return None
    return settings.model or VARIANTS[settings.variant].hf_repo


def config_for(settings: Settings, model: str | None, kind: str) -> str:
    """CONFIG, else the config VARIANT and SCALE pick (MODEL's flavor at full scale; the CPU bench on a CPU)."""
    variant = VARIANTS[settings.variant]
    if settings.config:
        return settings.config
    if model:
        return variant.configs["full"] if model == variant.hf_repo else variant.config_for(model)
    return variant.configs["bench_cpu" if settings.scale == "bench" and kind == "cpu" else settings.scale]


def assets_path(settings: Settings, model: str | None) -> str | None:
    """Where the full-scale assets of the model live: $ASSETS_DIR/<repo name>, as `hf download --local-dir`."""
    if not model:  # smoke and bench configs carry their own bundled assets
        return None
    return os.path.join(os.path.abspath(settings.assets_dir), model.rsplit("/", 1)[-1])


def refuse_owned_flags(args, source: str) -> None:
    """A torchtitan flag the launcher sets from a variable cannot come from EXTRA_ARGS or the command line: the
    launcher would housekeep one folder while torchtitan writes another."""
    for arg in args:
        name = arg.lstrip("-").split("=", 1)[0].replace("-", "_") if arg.startswith("--") else None
        if name in OWNED_FLAGS:
            raise UsageError(f"{source} sets --{name}, which the launcher owns: use {OWNED_FLAGS[name]} instead")


def init_source(settings: Settings, assets: str | None) -> str | None:
    """The Hugging Face folder INIT_FROM names, absolute (torchtitan resolves initial_load_path from the workers'
    working directory); `hub` is the variant's assets folder, which the launcher fills with the weights."""
    if not settings.init_from:
        return None
    if settings.init_from == "hub":
        if not assets:
            raise UsageError(
                f"INIT_FROM='hub' is for SCALE=full (MODEL's Hub weights), not SCALE={settings.scale}: "
                "give a local Hugging Face model folder"
            )
        return assets
    return os.path.abspath(settings.init_from)


def checkpoint_args(settings: Settings, source: str | None) -> list:
    """CHECKPOINT_DIR: save every CHECKPOINT_INTERVAL steps, resume from the newest step-N there; the last save
    keeps the optimizer (`no-last-save-model-only`), so a finished run can be continued with more steps. INIT_FROM:
    torchtitan's initial load of HF safetensors, model only (a complete checkpoint in CHECKPOINT_DIR wins)."""
    args = []
    if settings.checkpoint_dir:
        args += [
            "--checkpoint.enable",
            f"--checkpoint.folder={os.path.abspath(settings.checkpoint_dir)}",
            f"--checkpoint.interval={settings.checkpoint_interval}",
            f"--checkpoint.keep_latest_k={settings.checkpoint_keep}",
            "--checkpoint.no-last-save-model-only",
        ]
    if source:
        args += [
            "--checkpoint.enable",
            f"--checkpoint.initial_load_path={source}",
            "--checkpoint.initial_load_in_hf",
            "--checkpoint.initial_load_model_only",
        ]
        if not settings.checkpoint_dir:  # load the weights, write no checkpoints
            args += ["--checkpoint.load_only"]
    return args


def passed_args(settings: Settings, environ) -> list:
    """Every variable set in the environment whose contract flag is one torchtitan flag, as `--flag=value`."""
    args = []
    for var in VARS:
        value = getattr(settings, var.name.lower())
        if not var.flag.startswith("--") or " " in var.flag or var.name in BUILT or var.name not in environ:
            continue
        if var.name in PATHS and (var.name == "EXPORT_DIR" or os.path.exists(value)):
            value = os.path.abspath(value)
        elif var.name == "DATASET" and mix_parts(value):
            value = ",".join(f"{os.path.abspath(path)}:{weight}" for path, weight in mix_parts(value))
        args.append(f"{var.flag}={value}")
    return args


def torchtitan_args(
    settings: Settings, devices: Devices, model: str | None, assets: str | None, environ, cli_args=()
) -> list:
    """Paths go as `--flag=/absolute/path`: a path that starts with `-` would otherwise be read as a flag."""
    args = [f"--device={devices.kind}"]
    # The user's data through the recipes' DataLoader: its token cache (`--dataloader.cache_dir=` turns it off)
    if settings.module == RECIPE_MODULE and (settings.dataset or settings.validation):
        args.append(f"--dataloader.cache_dir={os.path.join(os.path.abspath(settings.cache_dir), TOKEN_CACHE)}")
    if settings.compile:
        args += ["--compile.enable", f"--compile.backend={COMPILE_BACKEND[devices.kind]}"]
    if assets:
        args += [f"--hf_assets_path={assets}", f"--report.model={model}"]
        if VARIANTS[settings.variant].hf_config_arg:  # the model's config.json from the same folder, not the Hub
            args.append(f"{VARIANTS[settings.variant].hf_config_arg}={assets}")
    if environ.get("WANDB_API_KEY") or settings.wandb_mode == "offline":
        args.append("--metrics.enable_wandb")
    refuse_owned_flags(settings.extra_args, "EXTRA_ARGS")
    refuse_owned_flags(cli_args, "the command line")
    return [
        *args,
        *passed_args(settings, environ),
        *checkpoint_args(settings, init_source(settings, assets)),
        f"--dump_folder={os.path.abspath(settings.output_dir)}",
        *settings.extra_args,
        *cli_args,
    ]


# The compile caches the workers use, per device kind: variable -> folder under CACHE_DIR/<variant>/.
CACHE_VARS = {
    "neuron": {
        "TORCH_NEURONX_NEFF_CACHE_DIR": "neff",
        "TORCH_NEURONX_HLO_CACHE_DIR": "hlo",
        "NKI_COMPILE_CACHE_URL": "nki",
    },
    "cuda": {"TORCHINDUCTOR_CACHE_DIR": "inductor"},
    "cpu": {"TORCHINDUCTOR_CACHE_DIR": "inductor"},
}


def cache_dirs(settings: Settings, kind: str) -> dict:
    """The compile-cache variables, each in its own folder under CACHE_DIR/<variant>/ (absolute: compilers run in
    their own working directories). Variants compile different graphs, so they never share a folder."""
    cache = os.path.join(os.path.abspath(settings.cache_dir), settings.variant)
    return {name: f"{cache}/{folder}" for name, folder in CACHE_VARS[kind].items()}


def env_additions(settings: Settings, devices: Devices, nproc: int, environ) -> dict:
    """What the workers' runtimes read from the environment (torch, the Neuron runtime, compilers, the Hub)."""
    env = {"PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}  # a worker killed by SIGABRT/SIGSEGV logs its stack
    defaults = cache_dirs(settings, devices.kind)
    if devices.kind == "neuron":
        env["NEURON_LOGICAL_NC_CONFIG"] = str(settings.neuron_logical_nc_config)
        if "NEURON_RT_VISIBLE_CORES" in environ:
            env["NEURON_RT_VISIBLE_CORES"] = environ["NEURON_RT_VISIBLE_CORES"]
    elif devices.kind == "cpu":
        defaults["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    if settings.scale != "full":  # smoke and bench runs (bundled assets) never touch the network
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    if settings.max_restarts:
        # torchrun keeps one rendezvous store across worker restarts by default, and restarted gloo workers then
        # read their peers' addresses from the failed attempt ("Gloo connectFullMesh failed ... Connection
        # refused"; pytorch/pytorch#135712): a store per attempt avoids it.
        defaults["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env.update({name: value for name, value in defaults.items() if name not in environ})
    return env


def refuse_full_scale_on_cpu(settings: Settings, devices: Devices, environ) -> None:
    """The default SCALE=full on a host with no accelerator would fetch and train a 4B+ model on CPU."""
    if devices.kind == "cpu" and settings.scale == "full" and "SCALE" not in environ and not settings.config:
        raise UsageError(
            "SCALE is unset (full: the full-size model) and no Neuron device or GPU is here: set "
            "SCALE=smoke for the tiny model, or SCALE=full to train the full model on CPU knowingly"
        )


def build(settings: Settings, devices: Devices, environ, cli_args=(), launched_at: float | None = None) -> Plan:
    """The launch, from the settings, the devices and the arguments the launcher does not own (torchtitan's).
    `launched_at`: when the launcher started, for the run report's launch-to-first-step time."""
    refuse_full_scale_on_cpu(settings, devices, environ)
    model = model_for(settings)
    config = config_for(settings, model, devices.kind)
    rdzv = rendezvous.resolve(settings)
    nproc = process_count(settings, devices, rdzv)
    restarts = [f"--max-restarts={settings.max_restarts}"] if settings.max_restarts else []
    # torchrun SIGKILLs its workers 30 s after it is stopped; the stop bound is STOP_GRACE (launch.py)
    restarts.append(f"--shutdown-timeout={settings.stop_grace}")
    ranks = [] if settings.log_rank == "all" else ["--local-ranks-filter", settings.log_rank]
    assets = assets_path(settings, model)
    argv = (
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        *rdzv.torchrun_args(),
        *restarts,
        f"--log-dir={os.path.join(os.path.abspath(settings.output_dir), 'torchrun')}",
        *ranks,
        "--role",
        "rank",
        "--tee",
        "3",
        "-m",
        "torchtitan.train",
        "--module",
        settings.module,
        "--config",
        config,
        *([f"--report.launched_at={launched_at:.3f}"] if launched_at else []),
        *torchtitan_args(settings, devices, model, assets, environ, cli_args),
    )
    checkpoint_dir = os.path.abspath(settings.checkpoint_dir) if settings.checkpoint_dir else None
    return Plan(
        settings.variant,
        settings.scale,
        model,
        settings.module,
        config,
        devices,
        nproc,
        argv,
        env_additions(settings, devices, nproc, environ),
        rdzv,
        assets,
        checkpoint_dir,
    )
