"""Settings + devices -> one torchrun command and the environment it adds: everything a launch will do.

The command is the article's single-node launch, run through this interpreter so no PATH lookup is needed,
plus the rendezvous of a multi-node job (rendezvous.py) and the checkpoint flags when CHECKPOINT_DIR is set;
`--dry-run` prints the plan instead of running it. Nothing here touches the filesystem.
"""

import os
import sys
from dataclasses import dataclass

from entrypoint import models, rendezvous
from entrypoint.contract import Settings, UsageError
from entrypoint.discovery import Devices
from entrypoint.variants import VARIANTS

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
RECIPES = os.path.join(REPO, "recipes")
# Every worker ends in neuron_qwen3.trainer (torchtitan's main with the project's run hooks); the CPU worker
# applies the CPU adapter, the Neuron worker imports torch_neuronx, before torchtitan is imported.
WORKER = {"neuron": "neuron_qwen3.neuron_worker", "cuda": "neuron_qwen3.trainer", "cpu": "neuron_qwen3.cpu_worker"}
COMPILE_BACKEND = {"neuron": "neuron", "cuda": "inductor", "cpu": "inductor"}
UNIT = {"neuron": "logical NeuronCores", "cuda": "GPUs", "cpu": "CPU cores"}
# Device memory per logical NeuronCore on trn2 (96 GiB per device) by NEURON_LOGICAL_NC_CONFIG.
NEURON_GIB_PER_CORE = {"1": 12, "2": 24}
# torchtitan flags whose value the launcher owns (it also acts on it: housekeeping, folders): the variable to set.
OWNED_FLAGS = {"module": "MODULE", "config": "CONFIG (or VARIANT and SCALE)", "dump_folder": "OUTPUT_DIR",
               "checkpoint.enable": "CHECKPOINT_DIR", "checkpoint.folder": "CHECKPOINT_DIR",
               "checkpoint.keep_latest_k": "CHECKPOINT_KEEP",
               "checkpoint.interval": "CHECKPOINT_INTERVAL", "hf_assets_path": "ASSETS_DIR (and MODEL)"}


@dataclass(frozen=True)
class Plan:
    variant: str
    scale: str
    model: str | None  # the Hub id at full scale; None: smoke's bundled model, or CONFIG's own
    parallelism: dict  # {"fits": bool, "why": one line}: how the model is spread over the ranks
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


def model_for(settings: Settings) -> str | None:
    """MODEL, else the variant's; its family must be the variant's. None at smoke scale (the bundled tiny model)."""
    variant = VARIANTS[settings.variant]
    if settings.scale != "full":
        if settings.model:
            raise UsageError(f"MODEL={settings.model!r} is for SCALE=full; SCALE=smoke trains the bundled tiny model")
        return None
    model = settings.model or variant.hf_repo
    family = models.MODELS[model].family
    if family != variant.family:
        raise UsageError(f"MODEL={model!r} is a {family} Qwen3 and VARIANT={variant.name} trains {variant.family} "
                         f"ones (allowed: {', '.join(m for m, s in models.MODELS.items() if s.family == variant.family)})")
    return model


def config_for(settings: Settings, model: str | None) -> str:
    """CONFIG, else the config VARIANT and SCALE pick (the article's for the variant's own model)."""
    variant = VARIANTS[settings.variant]
    if settings.config:
        if settings.model:
            raise UsageError(f"MODEL={settings.model!r} and CONFIG={settings.config!r} exclude each other: the "
                             "config function decides the model")
        return settings.config
    if model and model != variant.hf_repo:
        return variant.any_model_config
    return variant.configs[settings.scale]


def assets_path(settings: Settings, model: str | None) -> str | None:
    """Where the full-scale assets of the model live: $ASSETS_DIR/<repo name>, as `hf download --local-dir`."""
    if not model:  # smoke configs carry their own bundled assets
        return None
    return os.path.join(os.path.abspath(settings.assets_dir), models.repo_name(model))


def refuse_owned_flags(args, source: str) -> None:
    """A torchtitan flag the launcher sets from a variable cannot come from EXTRA_ARGS or the command line: the
    launcher would housekeep one folder while torchtitan writes another."""
    for arg in args:
        name = arg.lstrip("-").split("=", 1)[0].replace("-", "_") if arg.startswith("--") else None
        if name in OWNED_FLAGS:
            raise UsageError(f"{source} sets --{name}, which the launcher owns: use {OWNED_FLAGS[name]} instead")


def parallelism(settings: Settings, devices: Devices, model: str | None, nproc: int, nnodes: int) -> dict:
    """FSDP over every rank, as the article, and whether the model's sharded state fits a logical NeuronCore's
    memory (an estimate: preflight warns when it does not; GPU and CPU memory are not known here)."""
    if not model:
        return {"fits": True, "why": f"FSDP over {nproc * nnodes} ranks (the config's own model)"}
    memory = NEURON_GIB_PER_CORE[settings.neuron_logical_nc_config] if devices.kind == "neuron" else None
    fits, line = models.fit(models.MODELS[model], nproc * nnodes, memory)
    return {"fits": fits, "why": line}


def checkpoint_args(settings: Settings) -> list:
    """Save every CHECKPOINT_INTERVAL steps into CHECKPOINT_DIR; torchtitan resumes from the newest step-N there.

    The last checkpoint keeps the optimizer (`no-last-save-model-only`) so that a finished run can be restarted
    with more steps; checkpoints.py has already moved aside any step-N a restart must not load.
    """
    if not settings.checkpoint_dir:
        return []
    return ["--checkpoint.enable", f"--checkpoint.folder={os.path.abspath(settings.checkpoint_dir)}",
            "--checkpoint.interval", str(settings.checkpoint_interval),
            "--checkpoint.keep_latest_k", str(settings.checkpoint_keep), "--checkpoint.no-last-save-model-only"]


def init_source(settings: Settings, assets: str | None) -> str | None:
    """The Hugging Face folder INIT_FROM names, absolute (torchtitan resolves initial_load_path from the workers'
    working directory); `hub` is the variant's assets folder, which the launcher fills with the weights."""
    if not settings.init_from:
        return None
    if settings.init_from == "hub":
        if settings.scale != "full":
            raise UsageError("INIT_FROM='hub' is not allowed at SCALE=smoke (offline, tiny model): give a local "
                             "Hugging Face model folder")
        return os.path.abspath(assets)
    return os.path.abspath(settings.init_from)


def weights_args(settings: Settings, assets: str | None) -> list:
    """INIT_FROM through torchtitan's initial load (HF safetensors, model only; a complete checkpoint in
    CHECKPOINT_DIR wins); EXPORT_DTYPE as torchtitan's export dtype (the export itself: neuron_qwen3/weights.py)."""
    args = []
    source = init_source(settings, assets)
    if source:
        args += ["--checkpoint.enable", f"--checkpoint.initial_load_path={source}", "--checkpoint.initial_load_in_hf",
                 "--checkpoint.initial_load_model_only"]
        if not settings.checkpoint_dir:  # load the weights, write no checkpoints
            args += ["--checkpoint.load_only"]
    if settings.export_dir:
        args += ["--checkpoint.export_dtype", settings.export_dtype]
    return args


def torchtitan_args(settings: Settings, kind: str, assets: str | None, cli_args=()) -> list:
    """Paths go as `--flag=/absolute/path`: a path that starts with `-` would otherwise be read as a flag."""
    args = ["--training.steps", str(settings.steps)] if settings.steps else []
    if settings.compile:
        args += ["--compile.enable", "--compile.backend", COMPILE_BACKEND[kind]]
    if assets:
        args.append(f"--hf_assets_path={assets}")
        if VARIANTS[settings.variant].hf_config_arg:  # the model's config.json from the same folder, not the Hub
            args.append(f"{VARIANTS[settings.variant].hf_config_arg}={assets}")
    refuse_owned_flags(settings.extra_args, "EXTRA_ARGS")
    refuse_owned_flags(cli_args, "the command line")
    return [*args, *checkpoint_args(settings), *weights_args(settings, assets),
            f"--dump_folder={os.path.abspath(settings.output_dir)}", *settings.extra_args, *cli_args]


# The compile caches the workers use, per device kind: variable -> folder under CACHE_DIR/<variant>/.
CACHE_VARS = {"neuron": {"TORCH_NEURONX_NEFF_CACHE_DIR": "neff", "TORCH_NEURONX_HLO_CACHE_DIR": "hlo",
                         "NKI_COMPILE_CACHE_URL": "nki"},
              "cuda": {"TORCHINDUCTOR_CACHE_DIR": "inductor"}, "cpu": {"TORCHINDUCTOR_CACHE_DIR": "inductor"}}


def cache_dirs(settings: Settings, kind: str) -> dict:
    """The compile-cache variables, each in its own folder under CACHE_DIR/<variant>/ (absolute: compilers run in
    their own working directories). Variants compile different graphs, so they never share a folder."""
    cache = os.path.join(os.path.abspath(settings.cache_dir), settings.variant)
    return {name: f"{cache}/{folder}" for name, folder in CACHE_VARS[kind].items()}


def env_additions(settings: Settings, devices: Devices, nproc: int, model: str | None, environ) -> dict:
    # the recipes, and the launcher's stdlib modules they read (entrypoint.models, .names), from any directory
    env = {"PYTHONPATH": os.pathsep.join(filter(None, (RECIPES, REPO, environ.get("PYTHONPATH")))),
           "PYTHONUNBUFFERED": "1"}
    if model:
        env["MODEL"] = model  # resolved: the any-model config functions read it
    defaults = cache_dirs(settings, devices.kind)
    if devices.kind == "neuron":
        env["NEURON_LOGICAL_NC_CONFIG"] = settings.neuron_logical_nc_config
        if "NEURON_RT_VISIBLE_CORES" in environ:
            env["NEURON_RT_VISIBLE_CORES"] = environ["NEURON_RT_VISIBLE_CORES"]
    elif devices.kind == "cpu":
        defaults["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    if settings.export_dir:  # read by the workers' export (neuron_qwen3/weights.py)
        env["EXPORT_DIR"] = os.path.abspath(settings.export_dir)
    if settings.dataset and os.path.exists(settings.dataset):  # workers may start elsewhere: local data absolute
        env["DATASET"] = os.path.abspath(settings.dataset)
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
        raise UsageError("SCALE is unset (full: the full-size model) and no Neuron device or GPU is here: set "
                         "SCALE=smoke for the tiny model, or SCALE=full to train the full model on CPU knowingly")


def build(settings: Settings, devices: Devices, environ, cli_args=()) -> Plan:
    """The launch, from the settings, the devices and the arguments the launcher does not own (torchtitan's)."""
    refuse_full_scale_on_cpu(settings, devices, environ)
    model = None if settings.config else model_for(settings)
    config = config_for(settings, model)
    rdzv = rendezvous.resolve(settings)
    nproc = process_count(settings, devices, rdzv)
    restarts = [f"--max-restarts={settings.max_restarts}"] if settings.max_restarts else []
    # torchrun SIGKILLs its workers 30 s after it is stopped; the stop bound is STOP_GRACE (launch.py)
    restarts.append(f"--shutdown-timeout={settings.stop_grace}")
    ranks = [] if settings.log_rank == "all" else ["--local-ranks-filter", settings.log_rank]
    assets = assets_path(settings, model)
    argv = (sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", *rdzv.torchrun_args(),
            *restarts, f"--log-dir={os.path.join(os.path.abspath(settings.output_dir), 'torchrun')}",
            *ranks, "--role", "rank", "--tee", "3",
            "-m", WORKER[devices.kind], "--module", settings.module, "--config", config,
            *torchtitan_args(settings, devices.kind, assets, cli_args))
    checkpoint_dir = os.path.abspath(settings.checkpoint_dir) if settings.checkpoint_dir else None
    return Plan(settings.variant, settings.scale, model, parallelism(settings, devices, model, nproc, rdzv.nnodes),
                settings.module, config, devices, nproc, argv, env_additions(settings, devices, nproc, model, environ),
                rdzv, assets, checkpoint_dir)
