"""The environment contract: every variable the container reads, in one table, and its parser.

The image is configured only through these variables (`docker run -e NAME=value`), so this table is the
interface: `--help` prints it, the tests iterate over it, and the README's env table is copied from it.
Bad input stops the launcher before anything starts, with one line naming the variable and what it accepts.
"""

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from entrypoint.variants import DEFAULT_VARIANT, SCALES, VARIANTS

SWITCH = {"0": False, "false": False, "no": False, "off": False, "1": True, "true": True, "yes": True, "on": True}


class UsageError(Exception):
    """Bad input or an impossible request: main prints it as one line on stderr and exits with status 2."""


def choice(options):
    def parse(raw):
        if raw not in options:
            raise ValueError
        return raw

    return parse


def positive_int(raw):
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError
    return int(raw)


def core_list(raw):
    """`3`, `0-3`, `0-3,8`, `0,2,4-7` -> (ids...); reversed ranges and duplicates are refused."""
    ids = []
    for part in raw.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or not (high or low).isdigit() or int(low) > int(high or low):
            raise ValueError
        ids.extend(range(int(low), int(high or low) + 1))
    if len(set(ids)) != len(ids):
        raise ValueError
    return tuple(ids)


def switch(raw):
    return SWITCH[raw.strip().lower()]


def comma_list(raw):
    return tuple(part.strip() for part in raw.split(",") if part.strip())


@dataclass(frozen=True)
class Var:
    name: str
    default: str | None  # None: unset unless given
    allowed: str  # completes "NAME='x' is not ..." in errors
    meaning: str
    parse: Callable[[str], object] = str  # raises ValueError on a value outside `allowed`


VARS = (
    Var("VARIANT", DEFAULT_VARIANT, "one of: " + ", ".join(VARIANTS), "which Qwen3 setup to train (`--list`)",
        choice(tuple(VARIANTS))),
    Var("SCALE", "full", "one of: " + ", ".join(SCALES),
        "`full`: the article's model on every core; `smoke`: a tiny model, bundled assets, offline", choice(SCALES)),
    Var("COMPILE", "0", "one of: " + ", ".join(SWITCH),
        "1: torch.compile (backend `neuron` on Trainium, `inductor` elsewhere); 0: eager", switch),
    Var("STEPS", None, "a positive integer", "training steps (`--training.steps`); default: the config's",
        positive_int),
    Var("NPROC", None, "a positive integer", "processes; default one per logical NeuronCore or GPU, 1 on CPU",
        positive_int),
    Var("EXTRA_ARGS", "", "shell words", "extra torchtitan arguments, appended last",
        lambda raw: tuple(shlex.split(raw))),
    Var("ASSETS_DIR", "./assets/hf", "a path",
        "full scale: `--hf_assets_path $ASSETS_DIR/<repo name>` (e.g. `Qwen3-4B`)"),
    Var("OUTPUT_DIR", "./outputs", "a path", "checkpoints, logs, traces (`--dump_folder`)"),
    Var("CACHE_DIR", "./cache", "a path",
        "compile caches (`neff/`, `hlo/`, `nki/` on Neuron, `inductor/` elsewhere): mount it to keep them"),
    Var("NEURON_LOGICAL_NC_CONFIG", "2", "one of: 1, 2",
        "physical NeuronCores per logical core: 2 -> 4 cores per trn2 device, 1 -> 8", choice(("1", "2"))),
    Var("NEURON_RT_VISIBLE_CORES", None, "a core list like 3, 0-3 or 0-3,8 (ascending, no repeats)",
        "logical NeuronCores to use; default all", core_list),
    Var("CUDA_VISIBLE_DEVICES", None, "a comma list of GPU indices", "GPUs to use; empty: none", comma_list),
    Var("HF_TOKEN", None, "a token", "Hub token for gated downloads; never printed"),
    Var("NEURON_QWEN3_ROOT", "/", "a path", "filesystem root for device discovery (tests point it at a fake `/dev`)"),
)


@dataclass(frozen=True)
class Settings:
    """The parsed environment: one field per Var, named in lower case."""

    variant: str
    scale: str
    compile: bool
    steps: int | None
    nproc: int | None
    extra_args: tuple
    assets_dir: str
    output_dir: str
    cache_dir: str
    neuron_logical_nc_config: str
    neuron_rt_visible_cores: tuple | None
    cuda_visible_devices: tuple | None
    hf_token: str | None = field(repr=False)
    neuron_qwen3_root: str


def parse(env) -> Settings:
    values = {}
    for var in VARS:
        raw = env.get(var.name, var.default)
        try:
            values[var.name.lower()] = None if raw is None else var.parse(raw)
        except (ValueError, KeyError):
            raise UsageError(f"{var.name}={raw!r} is not {var.allowed}") from None
    return Settings(**values)


def redact(text: str, token: str | None) -> str:
    """Hide HF_TOKEN in anything printed: error lines, the plan, the launch line."""
    return text.replace(token, "***") if token else text
