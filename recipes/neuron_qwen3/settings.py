"""The project's Config sections, the flags it adds to torchtitan's (`--export.dir`, `--lora.rank`, ...), as
torchtitan's fault-tolerance trainer adds `--fault_tolerance.*`. Each field's docstring is its help (`--help`,
docs/settings.md); the launcher's variables (entrypoint/contract.py) map onto these fields.

Each section checks itself when it is built (tyro's parse of the flags, a config function's values): a value out of
its range, or a `Literal` field's value not one of its choices, is a ValueError of one line naming the flag, which
tyro prints and exits 2 on, and which the pre-launch pass answers as that line (prelaunch/preflight.py). A `Literal`
is a setting's one list of choices: the code that acts on it reads them with `choices` (tests/test_settings.py keeps
the launcher's own list of each equal to it).
"""

import math
import typing
from dataclasses import dataclass, field, fields
from typing import Annotated, Literal

import tyro

MIN_HISTORY = 5  # run/divergence.py judges a spike once this many logged losses are behind it


def choices(section: type, name: str) -> tuple:
    """The values a `Literal` field of a section (or of any dataclass) accepts; () for a field of another type."""
    kind = typing.get_type_hints(section)[name]
    return typing.get_args(kind) if typing.get_origin(kind) is Literal else ()


class Section:
    """A Config section: its fields are the flags `--<section>.<field>`, the section named as its class in lower case
    (RunSettings' field of it). Built, it refuses a choice off its `Literal` and what `check` refuses."""

    __slots__ = ()

    def __post_init__(self) -> None:
        for name in (f.name for f in fields(self)):
            options = choices(type(self), name)
            if options and getattr(self, name) not in options:
                self.refuse(name, f"is not one of {', '.join(map(str, options))}")
        self.check()

    def check(self) -> None:
        """The section's own rules: `refuse` a field's value that breaks one."""

    def refuse(self, name: str, rule: str) -> None:
        raise ValueError(f"--{type(self).__name__.lower()}.{name}={getattr(self, name)} {rule}")


def _from(low: float, value: float, above: bool = False) -> bool:
    """A finite number from `low` (above it, with `above`); nan is not."""
    return (low < value if above else low <= value) and value < math.inf


@dataclass(kw_only=True, slots=True)
class Export(Section):
    dir: str = ""
    """After training (also when the data runs out), a Hugging Face model folder here (config.json, safetensors
    in the Hub's sharded layout, tokenizer), every rank writing its own part, renamed into place; empty: none."""
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """dtype of the exported weights"""
    merged: Annotated[bool, tyro.conf.FlagConversionOff] = False
    """With LoRA: the merged full model (as without LoRA), the adapter in `<dir>/adapter`; False: the PEFT adapter
    folder alone. `--export.merged=True` (a value, as the launcher passes every variable)."""
    max_shard_mb: int = 5000
    """The largest safetensors file, in MB of 10^6 bytes (the Hub's 5GB); a larger tensor is a file of its own."""

    def check(self) -> None:
        if self.max_shard_mb < 1:
            self.refuse("max_shard_mb", "is not a positive number of MB")


@dataclass(kw_only=True, slots=True)
class Lora(Section):
    rank: int = 0
    """Train LoRA adapters of this rank over the initial load's frozen weights (lora/adapters.py); 0: full
    fine-tuning."""
    alpha: float = 0.0
    """The update is scaled by alpha / rank; 0: 2 x rank."""
    dropout: float = 0.0
    """Dropout on the adapters' input (not on MoE experts: PEFT has none there)."""
    targets: str = ""
    """Comma list of the Hugging Face projections adapted (targets.TARGETS); empty: the attention and MLP projections
    on dense models, the attention projections on MoE."""
    adapter: tyro.conf.Suppress[str] = ""
    """Not a flag: the PEFT adapter folder that INIT_FROM named, whose rank, alpha, dropout and targets these are,
    continued (lora/folders.py: resolve, in finish.py)."""

    def check(self) -> None:
        if self.rank < 0:
            self.refuse("rank", "is not 0 (full fine-tuning) or a positive rank")
        if not _from(0, self.alpha):
            self.refuse("alpha", "is not 0 (2 x rank) or a positive number")
        if not 0 <= self.dropout < 1:
            self.refuse("dropout", "must be in [0, 1)")

    @property
    def scale(self) -> float:
        """The adapters' update is scaled by alpha / rank (alpha 0: 2 x rank)."""
        return (self.alpha or 2.0 * self.rank) / self.rank

    @property
    def names(self) -> tuple[str, ...]:
        """`targets` as names, in their order; (): the model family's default (lora/targets.py: targets_of)."""
        return tuple(name.strip() for name in self.targets.split(",") if name.strip())


@dataclass(kw_only=True, slots=True)
class Neuron(Section):
    logical_nc_config: Literal[1, 2] = 2
    """Physical NeuronCores per logical core (NEURON_LOGICAL_NC_CONFIG): the NKI kernels' and the MFU peak's LNC."""
    moe_kernel: Literal["auto", "nki", "reference"] = "auto"
    """nki_moe expert kernel: auto is NKI on Neuron and the PyTorch reference elsewhere."""
    attention_kernel: Literal["auto", "nki", "reference"] = "auto"
    """Attention: auto is nkilib's kernels on Neuron and torchtitan's flex attention elsewhere; nki or reference
    put document attention (attention/) in flex's place on any device, on those kernels or their PyTorch
    reference."""


@dataclass(kw_only=True, slots=True)
class Moe(Section):
    aux_loss: float | None = None
    """MOE_AUX_LOSS: the coefficient of Qwen3-MoE's load-balancing loss added to the loss (moe/routing.py); None:
    INIT_FROM's config.json router_aux_loss_coef, else Qwen3-MoE's 0.001 (finish.py); 0: off."""
    z_loss: float = 0.0
    """MOE_Z_LOSS: the coefficient of the router z-loss (ST-MoE)."""
    router: Literal["train", "freeze"] = "train"
    """MOE_ROUTER: freeze keeps every router's weights as loaded (INIT_FROM), out of the optimizer."""

    def check(self) -> None:
        for name in ("aux_loss", "z_loss"):
            value = getattr(self, name)
            if value is not None and not _from(0, value):
                self.refuse(name, "is not a coefficient from 0")


@dataclass(kw_only=True, slots=True)
class Preference(Section):
    method: Literal["sft", "dpo", "grpo"] = "sft"
    """METHOD: sft trains on the data's tokens; dpo on preference pairs (chosen and rejected, data/pairs.py) against
    a reference model (preference/); grpo on completions the model generates for prompt-only records, scored by
    reward functions (rl/, the `grpo` section)."""
    beta: float = 0.1
    """DPO_BETA: how far the policy may move from the reference (TRL's beta)."""
    loss: Literal["sigmoid", "ipo"] = "sigmoid"
    """DPO_LOSS: sigmoid (DPO) or ipo (IPO, each side's log-ratio averaged over its tokens), as TRL computes them."""
    sft_weight: float = 0.0
    """DPO_SFT_WEIGHT: the weight of an SFT term beside the DPO loss, the chosen completions' mean token NLL (TRL's
    "sft" loss type beside "sigmoid": RPO); 0: none."""
    precompute: Annotated[bool, tyro.conf.FlagConversionOff] = False
    """DPO_PRECOMPUTE_REF: the reference's log-probabilities of every pair computed in one pass at the first step
    (every start), then looked up: no reference forward per step, and a frozen reference's weights freed (TRL's
    precompute_ref_log_probs)."""
    reference: str = ""
    """DPO_REFERENCE: a Hugging Face folder of the policy's architecture (TRL's ref_model), frozen and sharded as
    the policy; empty: with LoRA the base (the adapters off, no second copy), else INIT_FROM's folder (finish.py)."""

    def check(self) -> None:
        if not _from(0, self.beta, above=True):
            self.refuse("beta", "is not a positive number")
        if not _from(0, self.sft_weight):
            self.refuse("sft_weight", "is not a weight from 0")


@dataclass(kw_only=True, slots=True)
class Grpo(Section):
    """METHOD=grpo, with TRL 1.16 GRPOConfig's names and defaults."""

    generations: int = 8
    """GRPO_GENERATIONS: completions per prompt, a group (TRL's num_generations); it divides the completions a step
    trains on each rank (local batch x micro-steps)."""
    max_completion: int = 512
    """GRPO_MAX_COMPLETION: the most tokens a completion takes (max_completion_length)."""
    temperature: float = 1.0
    """GRPO_TEMPERATURE: the sampling temperature; the policy's log-probabilities are taken at it, as TRL's."""
    top_p: float = 1.0
    """GRPO_TOP_P: nucleus sampling; 1: off."""
    top_k: int = 0
    """GRPO_TOP_K: the k most likely tokens only; 0: off."""
    beta: float = 0.0
    """GRPO_BETA: the KL penalty's coefficient; 0: no reference model; above, the reference as DPO's (the base with
    the adapters off under LoRA, else a frozen INIT_FROM)."""
    epsilon: float = 0.2
    """GRPO_EPSILON: the ratio's lower clip, 1 - epsilon."""
    epsilon_high: float | None = None
    """GRPO_EPSILON_HIGH: the ratio's upper clip, 1 + epsilon_high (DAPO's clip-higher); None: epsilon."""
    loss: Literal["dapo", "grpo", "dr_grpo", "bnpo"] = "dapo"
    """GRPO_LOSS: how token losses are averaged: dapo over the step's completion tokens, grpo per completion then
    over completions, dr_grpo over completions x max_completion, bnpo over the micro-batch's tokens (TRL's)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """GRPO_SCALE_REWARDS: advantages divided by the group's reward std, the whole batch's, or not at all."""
    iterations: int = 1
    """GRPO_ITERATIONS: optimizer steps on each generated batch (TRL's num_iterations); above 1 the ratio is taken
    against the generator's log-probabilities."""
    mask_truncated: Annotated[bool, tyro.conf.FlagConversionOff] = False
    """GRPO_MASK_TRUNCATED: a completion cut by max_completion counts for nothing in the loss."""
    rewards: str = ""
    """GRPO_REWARDS: comma list of reward functions, built in (accuracy, format, length) or `module:function`
    (TRL's signature), imported with the data's folder first on the path."""
    reward_weights: str = ""
    """GRPO_REWARD_WEIGHTS: comma list of weights, one per reward; empty: 1 each."""
    seed: int = 0
    """GRPO_SEED: the sampler's seed; each rank and step draws from its own stream of it, so a resumed run draws the
    same completions."""

    def check(self) -> None:
        if self.generations < 2:
            self.refuse("generations", "is below 2: a group's advantages need two completions")
        if self.max_completion < 1:
            self.refuse("max_completion", "is not a positive number of tokens")
        if not _from(0, self.temperature, above=True):
            self.refuse("temperature", "is not a positive temperature")
        if not 0 < self.top_p <= 1:
            self.refuse("top_p", "must be in (0, 1]")
        if self.top_k < 0:
            self.refuse("top_k", "is not 0 (off) or a positive number of tokens")
        if not _from(0, self.beta):
            self.refuse("beta", "is not a coefficient from 0")
        for name in ("epsilon", "epsilon_high"):
            value = getattr(self, name)
            if value is not None and not _from(0, value):
                self.refuse(name, "is not a clip range from 0")
        if self.iterations < 1:
            self.refuse("iterations", "is not a positive number of steps")


@dataclass(kw_only=True, slots=True)
class Report(Section):
    variant: str = ""
    """The variant this config trains (v5, native, nki_moe), for summary.json; set by the config function."""
    scale: str = ""
    """full, smoke or bench; set by the config function."""
    config: str = ""
    """The config function's name; set by the config function."""
    model: str = ""
    """The Hugging Face id of the model trained at full scale (MODEL), for summary.json."""
    launched_at: float = 0.0
    """When the run was launched (seconds since the epoch), for its launch-to-first-step time; 0: torchrun's start."""
    progress_every_s: float = 60.0
    """The progress line (`step k/N`, tokens/s, ETA) at the first logged step, then at most this often."""

    def check(self) -> None:
        if not _from(0, self.launched_at):
            self.refuse("launched_at", "is not a time from 0 (seconds since the epoch)")
        if not _from(0, self.progress_every_s):
            self.refuse("progress_every_s", "is not a number of seconds from 0")


@dataclass(kw_only=True, slots=True)
class Samples(Section):
    prompts: str = ""
    """SAMPLE_PROMPTS: a local file of conversations (DATASET's formats; `enable_thinking` per record) that the
    model answers greedily at step 0, every `every` steps and after the last step (report/samples.py); empty:
    none."""
    tokens: int = 48
    """SAMPLE_TOKENS: the most new tokens an answer takes; it stops sooner at the template's end of turn."""
    every: int = 0
    """SAMPLE_INTERVAL: steps between samples; 0: the validation interval with validation, else none between
    step 0 and the last."""

    def check(self) -> None:
        if self.tokens < 1:
            self.refuse("tokens", "is not a positive number of tokens")
        if self.every < 0:
            self.refuse("every", "is not 0 or a positive number of steps")


@dataclass(kw_only=True, slots=True)
class Stop(Section):
    enable: bool = True
    """On SIGTERM/SIGINT, finish the step, save it on every rank (with --checkpoint.enable) and exit 128 + N."""


@dataclass(kw_only=True, slots=True)
class Tune(Section):
    lr: float | None = None
    """Learning rate of every optimizer param group (LR); None: the config's, 2e-5 with checkpoint.initial_load_path
    (a fine-tune: run/tuning.py)."""
    warmup: float | None = None
    """Warm-up (WARMUP_STEPS): whole steps, or a fraction of training.steps below 1; None: lr_scheduler.warmup_steps,
    8 % of the steps with checkpoint.initial_load_path (a fine-tune: run/tuning.py)."""

    def check(self) -> None:
        if self.lr is not None and not 0 <= self.lr <= 1:
            self.refuse("lr", "is not a learning rate from 0 to 1")
        if self.warmup is not None and not (
            0 <= self.warmup < 1 or self.warmup >= 1 and float(self.warmup).is_integer()
        ):
            self.refuse("warmup", "is neither a whole number of steps nor a fraction below 1")


@dataclass(kw_only=True, slots=True)
class Divergence(Section):
    policy: Literal["stop", "warn"] = "stop"
    """NAN_POLICY. A NaN or infinite loss always stops the run (exit 3) before its step is saved; a loss spike too
    with stop, while warn logs it and goes on (divergence.py)."""
    window: int = 20
    """How many recent logged losses the spike rule compares with."""
    factor: float = 10.0
    """A spike: a loss above the window's median + factor x its median absolute deviation (at least 3 % of the
    median)."""

    def check(self) -> None:
        if self.window < MIN_HISTORY:
            self.refuse("window", f"is below {MIN_HISTORY}, the losses a spike is judged on")
        if not _from(0, self.factor, above=True):
            self.refuse("factor", "is not a positive number")


@dataclass(kw_only=True)
class RunSettings:
    """The project's sections, shared by the Configs of both trainers (a plain dataclass mixin: two slotted bases
    cannot share fields)."""

    device: Literal["auto", "neuron", "cuda", "cpu"] = "auto"
    """Where this worker trains; auto: Neuron if torch_neuronx imports, else CUDA, else CPU."""
    cpu_float32: bool = True
    """On CPU, a full-scale config (report.scale full) computes in float32, its nki_moe experts too: bf16 matmuls
    are emulated on CPU (a first Qwen3-0.6B step did not finish in 6 minutes)."""
    export: Export = field(default_factory=Export)
    lora: Lora = field(default_factory=Lora)
    moe: Moe = field(default_factory=Moe)
    neuron: Neuron = field(default_factory=Neuron)
    preference: Preference = field(default_factory=Preference)
    grpo: Grpo = field(default_factory=Grpo)
    report: Report = field(default_factory=Report)
    samples: Samples = field(default_factory=Samples)
    stop: Stop = field(default_factory=Stop)
    tune: Tune = field(default_factory=Tune)
    divergence: Divergence = field(default_factory=Divergence)
