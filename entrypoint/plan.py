"""Settings + devices -> one torchrun command and the environment it adds: everything a launch will do.

The command is the article's single-node launch, run through this interpreter so no PATH lookup is needed;
`--dry-run` prints the plan instead of running it.
"""

import importlib.util
import os
import sys
from dataclasses import dataclass

from entrypoint.contract import Settings, UsageError
from entrypoint.discovery import Devices
from entrypoint.variants import RECIPE_MODULE, VARIANTS

RECIPES = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "recipes")
# the CPU worker applies the CPU adapter before torchtitan is imported, then runs torchtitan.train.main
WORKER = {"neuron": "torchtitan.train", "cuda": "torchtitan.train", "cpu": "neuron_qwen3.train"}
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


def process_count(settings: Settings, devices: Devices) -> int:
    nproc = settings.nproc or (1 if devices.kind == "cpu" else devices.count)
    if nproc > devices.count:
        raise UsageError(f"NPROC={nproc} is more than the {devices.count} {UNIT[devices.kind]} found "
                         f"(allowed: 1-{devices.count})")
    return nproc


def torchtitan_args(settings: Settings, kind: str) -> list:
    args = ["--training.steps", str(settings.steps)] if settings.steps else []
    if settings.compile:
        args += ["--compile.enable", "--compile.backend", COMPILE_BACKEND[kind]]
    if settings.scale == "full":  # smoke configs carry their own bundled assets
        repo_name = VARIANTS[settings.variant].hf_repo.rsplit("/", 1)[-1]
        args += ["--hf_assets_path", os.path.join(settings.assets_dir, repo_name)]
    return args + ["--dump_folder", settings.output_dir, *settings.extra_args]


def env_additions(settings: Settings, devices: Devices, nproc: int, environ) -> dict:
    env = {"PYTHONPATH": os.pathsep.join(filter(None, (RECIPES, environ.get("PYTHONPATH")))), "PYTHONUNBUFFERED": "1"}
    cache = os.path.abspath(settings.cache_dir)  # compilers run in their own working directories
    if devices.kind == "neuron":
        env["NEURON_LOGICAL_NC_CONFIG"] = settings.neuron_logical_nc_config
        if "NEURON_RT_VISIBLE_CORES" in environ:
            env["NEURON_RT_VISIBLE_CORES"] = environ["NEURON_RT_VISIBLE_CORES"]
        defaults = {"TORCH_NEURONX_NEFF_CACHE_DIR": f"{cache}/neff", "TORCH_NEURONX_HLO_CACHE_DIR": f"{cache}/hlo",
                    "NKI_COMPILE_CACHE_URL": f"{cache}/nki"}
    else:
        env["NEURON_QWEN3_DEVICE"] = devices.kind
        defaults = {"TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor"}
        if devices.kind == "cpu":
            defaults["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    if settings.scale == "smoke":  # smoke runs never touch the network
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.update({name: value for name, value in defaults.items() if name not in environ})
    return env


def build(settings: Settings, devices: Devices, environ) -> Plan:
    config = VARIANTS[settings.variant].configs[settings.scale]
    nproc = process_count(settings, devices)
    argv = (sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
            "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0",
            "--local-ranks-filter", "0", "--role", "rank", "--tee", "3",
            "-m", WORKER[devices.kind], "--module", RECIPE_MODULE, "--config", config,
            *torchtitan_args(settings, devices.kind))
    return Plan(settings.variant, settings.scale, RECIPE_MODULE, config, devices, nproc, argv,
                env_additions(settings, devices, nproc, environ))


def check_runtime(plan: Plan):
    """Fail in one line before torchrun starts workers that cannot reach the devices (find_spec imports nothing)."""
    if plan.devices.kind == "neuron" and importlib.util.find_spec("torch_neuronx") is None:
        raise UsageError(f"{len(plan.devices.nodes)} Neuron devices found but the torch_neuronx package is not "
                         "installed: run the Neuron image, or pass --dry-run to only print the plan")
