"""The environment contract: every variable the container reads, the torchtitan flag it becomes, and its parser.

The image is configured only through these variables (`docker run -e NAME=value`), and the launcher hands the
workers each value as a torchtitan flag (`Var.flag`), so this table is the interface: `--help` and the docs'
tables are rendered from it, the tests iterate over it. Values are parsed once, to their final types; bad input
stops the launcher before anything starts, with one line naming the variable and what it accepts.
"""

import difflib
import ipaddress
import re
import shlex
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, make_dataclass

from entrypoint.variants import DEFAULT_VARIANT, QWEN3_ID, RECIPE_MODULE, SCALES, VARIANTS

HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
WORD = re.compile(r"[A-Za-z0-9._-]+")
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
SWITCH = {"0": False, "false": False, "no": False, "off": False, "1": True, "true": True, "yes": True, "on": True}


class UsageError(Exception):
    """Bad input or an impossible request: main prints it as one line on stderr and exits with status 2."""


def choice(options):
    def parse(raw) -> str:
        if raw not in options:
            raise ValueError
        return raw

    return parse


def positive_int(raw) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError
    return int(raw)


def non_negative_int(raw) -> int:
    if not raw.isdigit():
        raise ValueError
    return int(raw)


def lnc(raw) -> int:
    return int(choice(("1", "2"))(raw))


def span(part):
    """`3` or `0-3` -> (the low end as written, range); `3-1`, `3-`, `-3` and non-digits are refused."""
    low, dash, high = part.partition("-")
    if not low.isdigit() or (dash and not high.isdigit()) or int(low) > int(high or low):
        raise ValueError
    return low, range(int(low), int(high or low) + 1)


def core_list(raw) -> tuple:
    """`3`, `0-3`, `0-3,8`, `0,2,4-7` -> (ids...); reversed ranges and duplicates are refused."""
    ids = []
    for part in raw.split(","):
        ids.extend(span(part.strip())[1])
    if len(set(ids)) != len(ids):
        raise ValueError
    return tuple(ids)


def switch(raw) -> bool:
    return SWITCH[raw.strip().lower()]


def comma_list(raw) -> tuple:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def shell_words(raw) -> tuple:
    return tuple(shlex.split(raw))


def port(raw) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ValueError
    return int(raw)


def host(raw) -> str:
    """A host name or an IPv4/IPv6 address, as a rendezvous endpoint needs it."""
    try:
        ipaddress.ip_address(raw)
        return raw
    except ValueError:
        if not HOST.fullmatch(raw):
            raise
    return raw


def word(raw) -> str:
    if not WORD.fullmatch(raw):
        raise ValueError
    return raw


def module_name(raw) -> str:
    if not MODULE_NAME.fullmatch(raw):
        raise ValueError
    return raw


def qwen3_id(raw) -> str:
    if not QWEN3_ID.fullmatch(raw):
        raise ValueError
    return raw


def local_ranks(raw) -> str:
    """`all`, or local ranks like `0` or `0,3`: torchrun's `--local-ranks-filter`."""
    if raw == "all":
        return raw
    ranks = [part.strip() for part in raw.split(",")]
    if not all(part.isdigit() for part in ranks) or len(set(ranks)) != len(ranks):
        raise ValueError
    return ",".join(ranks)


def procs_per_node(raw) -> int | None:
    """Kubeflow's `auto` (every core found) is None, like unset."""
    return None if raw == "auto" else positive_int(raw)


def keep_count(raw) -> int:
    count = non_negative_int(raw)
    if count == 1:  # torchtitan keeps at least two: the newest may be half-written
        raise ValueError
    return count


def node_list(raw) -> tuple:
    """Slurm's compressed host list: `trn-[001-003,007],head[1-2]` -> ("trn-001", ..., "head2"), padding kept."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(raw + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError
        if char == "," and depth == 0:
            items.append(raw[start:i])
            start = i + 1
    if depth:
        raise ValueError
    return tuple(word(name) for item in items for name in _expand(item))


def _expand(item):
    """One item of a host list, every bracket group expanded (`r[1-2]n[7,9]` -> r1n7, r1n9, r2n7, r2n9)."""
    head, bracket, rest = item.partition("[")
    if not bracket:
        return [item]
    ranges, closed, tail = rest.partition("]")
    if not closed or not ranges:
        raise ValueError
    numbers = []
    for part in ranges.split(","):
        low, numbers_in = span(part)
        numbers.extend(str(n).zfill(len(low)) for n in numbers_in)  # `001-003`: 001, 002, 003
    return [head + number + end for number in numbers for end in _expand(tail)]


@dataclass(frozen=True)
class Var:
    name: str
    default: str | None  # None: unset unless given
    allowed: str  # completes "NAME='x' is not ..." in errors
    meaning: str
    parse: Callable[[str], object] = str  # raises ValueError on a value outside `allowed`; its return type is the field's
    group: str = "run"  # the docs table it is listed in (DOCS_GROUPS)
    flag: str = ""  # the torchtitan flag(s) the workers get; one `--section.field` token is rendered `--x=value`
    secret: bool = False  # never shown: not in Settings' repr, redacted from every line the launcher prints


DOCS_GROUPS = {"run": "README.md", "paths": "README.md", "rendezvous": "docs/production.md",
               "kubeflow": "docs/production.md", "slurm": "docs/production.md", "faults": "docs/production.md",
               "preflight": "docs/production.md"}
VARS = (
    Var("VARIANT", DEFAULT_VARIANT, "one of: " + ", ".join(VARIANTS), "which Qwen3 setup to train (`--list`)",
        choice(tuple(VARIANTS)), flag="--config (with SCALE)"),
    Var("SCALE", "full", "one of: " + ", ".join(SCALES),
        "`full`: the article's model on every core; `smoke`: a tiny model, bundled assets, offline; `bench`: "
        "bundled assets, offline, a model for throughput (CPU: 0.2B, sequence 2048; GPU/Neuron: Qwen3-1.7B's "
        "shape, sequence 4096)", choice(SCALES), flag="--config (with VARIANT)"),
    Var("MODEL", None, "a Qwen3 Hub id like Qwen/Qwen3-8B (`--list`)",
        "full scale: which Qwen3 (size and form) to train; its family (dense, MoE) must be the variant's; default: "
        "the variant's", qwen3_id, flag="--config <variant>_qwen3_<flavor> --report.model"),
    Var("CONFIG", None, "a config function name (letters, digits, `_`)",
        "any config function of MODULE, exactly as torchtitan's `--config`; replaces the one VARIANT and SCALE pick",
        module_name, flag="--config"),
    Var("MODULE", RECIPE_MODULE, "a Python module name",
        "the recipes module (torchtitan's `--module`); mount your own and set CONFIG to train it", module_name,
        flag="--module"),
    Var("DEVICE", "auto", "one of: auto, neuron, cuda, cpu",
        "where to train; `auto`: Neuron if found, else CUDA, else CPU (`cpu` runs the CPU path on any host)",
        choice(("auto", "neuron", "cuda", "cpu")), flag="--device (the kind found)"),
    Var("LOG_RANK", "0", "`all`, or local ranks like 0 or 0,3",
        "whose output the console shows (torchrun `--local-ranks-filter`); every rank's log is kept in OUTPUT_DIR",
        local_ranks),
    Var("COMPILE", "0", "one of: " + ", ".join(SWITCH),
        "1: torch.compile (backend `neuron` on Trainium, `inductor` elsewhere); 0: eager", switch,
        flag="--compile.enable --compile.backend"),
    Var("STEPS", None, "a positive integer", "training steps; default: the config's", positive_int,
        flag="--training.steps"),
    Var("NPROC", None, "a positive integer",
        "processes per node; default PET_NPROC_PER_NODE, else one per logical NeuronCore or GPU, 1 on CPU",
        positive_int),
    Var("EXTRA_ARGS", "", "shell words",
        "extra torchtitan arguments, appended last (before the command line's); flags the launcher owns are refused",
        shell_words),
    Var("INIT_FROM", None, "`hub` or a path to a Hugging Face model folder",
        "unset: random init; `hub`: MODEL's Hub weights into ASSETS_DIR/<repo name> (full scale); a path: a local "
        "Hugging Face model folder (`config.json` + `*.safetensors`), loaded through torchtitan's state-dict adapter",
        flag="--checkpoint.initial_load_path --checkpoint.initial_load_in_hf --checkpoint.initial_load_model_only"),
    Var("EXPORT_DIR", None, "a path",
        "set: after training (also when the data runs out), a Hugging Face model folder there: config.json, "
        "safetensors, tokenizer; written atomically", flag="--export.dir"),
    Var("EXPORT_DTYPE", "bfloat16", "one of: bfloat16, float32", "dtype of the exported weights",
        choice(("bfloat16", "float32")), flag="--export.dtype"),
    Var("DATASET", None, "`c4`, a Hub dataset id, or a local .jsonl, .json, .parquet or .txt file or folder",
        "training data; default c4 at full scale, the bundled corpus at smoke; local files are read offline",
        flag="--dataloader.source"),
    Var("DATASET_FIELD", "text", "a field name (letters, digits, `.`, `_`, `-`)",
        "the record field that holds the text; a chat `messages` list (role/content) there makes the run SFT: "
        "only assistant tokens count in the loss", word, flag="--dataloader.field"),
    Var("WANDB_MODE", None, "a mode wandb accepts, e.g. offline",
        "Weights & Biases next to TensorBoard: on with WANDB_API_KEY, or WANDB_MODE=offline (wandb reads both)",
        flag="--metrics.enable_wandb"),
    Var("WANDB_API_KEY", None, "a key", "Weights & Biases key (see WANDB_MODE); never printed",
        flag="--metrics.enable_wandb", secret=True),
    Var("ASSETS_DIR", "./assets/hf", "a path",
        "full scale: `--hf_assets_path $ASSETS_DIR/<repo name>` (e.g. `Qwen3-4B`); fetched from the Hub when "
        "missing", group="paths", flag="--hf_assets_path"),
    Var("OUTPUT_DIR", "./outputs", "a path", "logs, traces, the run report", group="paths", flag="--dump_folder"),
    Var("CACHE_DIR", "./cache", "a path",
        "compile caches, per variant: `<variant>/{neff,hlo,nki}` on Neuron, `<variant>/inductor` elsewhere; "
        "mount it to keep them", group="paths"),
    Var("CHECKPOINT_DIR", None, "a path",
        "checkpoints (`step-N/`), shared by every node; set: save every CHECKPOINT_INTERVAL steps and resume from "
        "the newest complete one; unset: no checkpoints", group="paths",
        flag="--checkpoint.enable --checkpoint.folder"),
    Var("NEURON_LOGICAL_NC_CONFIG", "2", "one of: 1, 2",
        "physical NeuronCores per logical core: 2 -> 4 cores per trn2 device, 1 -> 8", lnc,
        flag="--neuron.logical_nc_config"),
    Var("NEURON_RT_VISIBLE_CORES", None, "a core list like 3, 0-3 or 0-3,8 (ascending, no repeats)",
        "logical NeuronCores to use; default all", core_list),
    Var("CUDA_VISIBLE_DEVICES", None, "a comma list of GPU indices", "GPUs to use; empty: none", comma_list),
    Var("HF_TOKEN", None, "a token", "Hub token for gated downloads; given to the asset fetch only (not to torchrun "
        "or the workers), whitespace stripped; never printed", secret=True),
    Var("HF_HUB_OFFLINE", "0", "one of: " + ", ".join(SWITCH),
        "1: never download; full-scale assets missing from ASSETS_DIR is then an error", switch),
    Var("NEURON_QWEN3_MOE_KERNEL", "auto", "one of: auto, nki, reference",
        "nki_moe expert kernel: `auto` is NKI on Neuron and the PyTorch reference elsewhere",
        choice(("auto", "nki", "reference")), flag="--neuron.moe_kernel"),
    # ---- multi-node: plain variables win over an engine's, field by field
    Var("NNODES", None, "a positive integer", "nodes in the job; default PET_NNODES, SLURM_NNODES, else 1",
        positive_int, "rendezvous"),
    Var("NODE_RANK", None, "an integer from 0", "this node's rank; 0 hosts the rendezvous; default PET_NODE_RANK, "
        "SLURM_NODEID, else 0", non_negative_int, "rendezvous"),
    Var("MASTER_ADDR", None, "a host name or IP address",
        "rendezvous host (node rank 0); default PET_MASTER_ADDR, the first host of SLURM_JOB_NODELIST", host,
        "rendezvous"),
    Var("MASTER_PORT", None, "a port (1-65535)", "rendezvous port; default PET_MASTER_PORT, else 29500", port,
        "rendezvous"),
    Var("RDZV_ID", None, "letters, digits, `.`, `_`, `-`",
        "rendezvous id, the same on every node; default SLURM_JOB_ID, else a hash of the settings all nodes share",
        word, "rendezvous"),
    Var("LOCAL_ADDR", None, "a host name or IP address",
        "multi-node: this node's address for its peers (torchrun `--local-addr`, e.g. the pod IP); default: "
        "torchrun's guess; one node always uses 127.0.0.1", host, "rendezvous"),
    Var("PET_NNODES", None, "a positive integer", "set by Kubeflow Trainer: nodes", positive_int, "kubeflow"),
    Var("PET_NODE_RANK", None, "an integer from 0", "set by Kubeflow Trainer: this node's rank", non_negative_int,
        "kubeflow"),
    Var("PET_MASTER_ADDR", None, "a host name or IP address", "set by Kubeflow Trainer: node 0's address", host,
        "kubeflow"),
    Var("PET_MASTER_PORT", None, "a port (1-65535)", "set by Kubeflow Trainer: rendezvous port", port, "kubeflow"),
    Var("PET_NPROC_PER_NODE", None, "auto or a positive integer",
        "set by Kubeflow Trainer (`numProcPerNode`): processes per node; `auto`: every core found", procs_per_node,
        "kubeflow"),
    Var("SLURM_NNODES", None, "a positive integer", "set by Slurm: nodes in the allocation", positive_int, "slurm"),
    Var("SLURM_NODEID", None, "an integer from 0", "set by Slurm: this node's index in the allocation",
        non_negative_int, "slurm"),
    Var("SLURM_JOB_NODELIST", None, "a Slurm node list like trn-[001-003,007]",
        "set by Slurm: the allocation's hosts; the first one hosts the rendezvous", node_list, "slurm"),
    Var("SLURM_JOB_ID", None, "letters, digits, `.`, `_`, `-`", "set by Slurm: the job id, used as RDZV_ID", word,
        "slurm"),
    # ---- faults and stops
    Var("CHECKPOINT_INTERVAL", "100", "a positive integer", "steps between checkpoints", positive_int, "faults",
        flag="--checkpoint.interval"),
    Var("CHECKPOINT_KEEP", "3", "0 or an integer from 2", "checkpoints kept, newest first; 0 keeps all",
        keep_count, "faults", flag="--checkpoint.keep_latest_k"),
    Var("MAX_RESTARTS", "0", "an integer from 0", "torchrun `--max-restarts`: worker failures survived in place, "
        "each resuming from the newest checkpoint", non_negative_int, "faults"),
    Var("STOP_GRACE", "20", "a positive integer (seconds)", "after SIGTERM/SIGINT, seconds before the launcher "
        "SIGKILLs every process it started: the step in flight and the save on stop must fit", positive_int,
        "faults"),
    # ---- preflight
    Var("PREFLIGHT", "strict", "one of: strict, warn",
        "strict: a failed preflight check stops the launch (exit 2); warn: it is printed as a warning",
        choice(("strict", "warn")), "preflight"),
    Var("NEURON_CC_FLAGS", None, "shell words", "Neuron compiler flags; its `--lnc` must equal "
        "NEURON_LOGICAL_NC_CONFIG", shell_words, "preflight"),
)
SECRETS = tuple(var.name for var in VARS if var.secret)


# The parsed environment: one field per Var, named in lower case, typed by its parser's return type.
Settings = make_dataclass(
    "Settings", [(var.name.lower(), typing.get_type_hints(var.parse).get("return", str) | None,
                  field(repr=not var.secret)) for var in VARS], frozen=True)


def parse(env) -> "Settings":
    values = {}
    for var in VARS:
        raw = env.get(var.name, var.default)
        try:
            values[var.name.lower()] = None if raw is None else var.parse(raw)
        except (ValueError, KeyError):
            raise UsageError(f"{var.name}={raw!r} is not {var.allowed}") from None
    return Settings(**values)


def markdown(groups) -> str:
    """The table of the variables in `groups`, as README.md and docs/production.md show it (tests compare)."""
    rows = ["| variable | default | accepts | torchtitan flag | meaning |", "|---|---|---|---|---|"]
    rows += [f"| `{var.name}` | {f'`{var.default}`' if var.default else '-'} | {var.allowed} | "
             f"{f'`{var.flag}`' if var.flag else '-'} | {var.meaning} |" for var in VARS if var.group in groups]
    return "\n".join(rows)


# Other launchers' variables that this one does not read, and what to use instead.
FOREIGN = {
    "NGPU": "NPROC (processes per node; default: every core or GPU found)",
    "CONFIG_FILE": "VARIANT and SCALE, or MODULE and CONFIG (config functions, not TOML files)",
    "NEURON_RT_NUM_CORES": "NEURON_RT_VISIBLE_CORES (which cores) or NPROC (how many processes)",
    "TRAIN_STEPS": "STEPS",
}
# Set by schedulers and runtimes, never typed by a user: not checked for near misses.
ENGINE_PREFIXES = ("SLURM_", "PET_", "KUBERNETES_", "OMPI_", "PMI_", "TORCHELASTIC_", "NVIDIA_")
# The deploy scripts' own variables, which reach the launcher through srun's environment: not near misses either.
DEPLOY_NAMES = ("NEURON_QWEN3_HOME",)  # deploy/slurm/train.sbatch: the checkout to run


def stray_names(env) -> list:
    """Warnings (one line each) for variables that look meant for this launcher but are not read by it."""
    known = {var.name for var in VARS}
    lines = []
    for name in sorted(env):
        if name in known:
            continue
        if name in FOREIGN:
            lines.append(f"{name} is not read by this launcher: use {FOREIGN[name]}")
        elif not name.startswith(ENGINE_PREFIXES) and name not in DEPLOY_NAMES:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
            if close:
                lines.append(f"{name} is not read by this launcher: did you mean {close[0]}?")
    return lines


def redact(text: str, env) -> str:
    """Hide every secret of `env` (HF_TOKEN, WANDB_API_KEY) in anything printed: error lines, the plan, the launch
    line. Also each without its surrounding whitespace: a Kubernetes secret made from a file keeps its newline."""
    secrets = {value for name in SECRETS for value in (env.get(name) or "", (env.get(name) or "").strip())} - {""}
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
