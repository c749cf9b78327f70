"""The project's trainers: torchtitan's Trainer with the run hooks and the project's Config sections.

Config functions (config_registry.py) return `Qwen3Trainer.Config` (or v5.py's `Qwen3TransformersTrainer.Config`),
so `config.build()` builds the hooked trainer, and stock `python -m torchtitan.train --module neuron_qwen3 --config
<any>` (the article's command, which the launcher runs) gets every hook: the device set-up, stop with a save on
SIGTERM, the fine-tuning knobs and defaults (tuning.py), the stop on a diverging loss (divergence.py), the run
report and the Hugging Face export. The sections below are the project's flags, as torchtitan's
fault-tolerance trainer adds `--fault_tolerance.*`: `--export.dir`, `--neuron.logical_nc_config`, ...
"""

import dataclasses
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Annotated, Literal

import tyro
from torchtitan.tools.logging import logger
from torchtitan.trainer import Trainer

from neuron_qwen3 import data, devices, divergence, lora, lora_io, report, same_config, stop, teardown, tuning, weights

# The override.imports entry that swaps the nki_moe experts (moe/experts.py), named here without importing it: a
# torchtitan without the override registry still runs the other variants.
NKI_EXPERTS = "neuron_qwen3.moe.experts.nki_grouped_experts"


@dataclass(kw_only=True, slots=True)
class Export:
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


@dataclass(kw_only=True, slots=True)
class Lora:
    rank: int = 0
    """Train LoRA adapters of this rank over the initial load's frozen weights (lora.py); 0: full fine-tuning."""
    alpha: float = 0.0
    """The update is scaled by alpha / rank; 0: 2 x rank."""
    dropout: float = 0.0
    """Dropout on the adapters' input (not on MoE experts: PEFT has none there)."""
    targets: str = ""
    """Comma list of the Hugging Face projections adapted (lora.TARGETS); empty: the attention and MLP projections
    on dense models, the attention projections on MoE."""


@dataclass(kw_only=True, slots=True)
class Neuron:
    logical_nc_config: int = 2
    """Physical NeuronCores per logical core (NEURON_LOGICAL_NC_CONFIG): the NKI kernels' and the MFU peak's LNC."""
    moe_kernel: Literal["auto", "nki", "reference"] = "auto"
    """nki_moe expert kernel: auto is NKI on Neuron and the PyTorch reference elsewhere."""


@dataclass(kw_only=True, slots=True)
class Report:
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


@dataclass(kw_only=True, slots=True)
class Stop:
    enable: bool = True
    """On SIGTERM/SIGINT, finish the step, save it on every rank (with --checkpoint.enable) and exit 128 + N."""


@dataclass(kw_only=True, slots=True)
class Tune:
    lr: float | None = None
    """Learning rate of every optimizer param group (LR); None: the config's, 2e-5 with checkpoint.initial_load_path
    (a fine-tune: tuning.py)."""
    warmup: float | None = None
    """Warm-up (WARMUP_STEPS): whole steps, or a fraction of training.steps below 1; None: lr_scheduler.warmup_steps,
    8 % of the steps with checkpoint.initial_load_path (a fine-tune: tuning.py)."""
    config_lrs: tuple[float, ...] = ()
    """The param groups' learning rates as the config function set them (set by it): one that differs now was given
    (a torchtitan flag, a user's config) and keeps its value in a fine-tune."""
    config_warmup: int = -1
    """lr_scheduler.warmup_steps as the config function set it (set by it; -1: unknown), likewise."""


@dataclass(kw_only=True, slots=True)
class Divergence:
    policy: Literal["stop", "warn"] = "stop"
    """NAN_POLICY. A NaN or infinite loss always stops the run (exit 3) before its step is saved; a loss spike too
    with stop, while warn logs it and goes on (divergence.py)."""
    window: int = 20
    """How many recent logged losses the spike rule compares with."""
    factor: float = 10.0
    """A spike: a loss above the window's median + factor x its median absolute deviation (at least 3 % of the
    median)."""


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
    neuron: Neuron = field(default_factory=Neuron)
    report: Report = field(default_factory=Report)
    stop: Stop = field(default_factory=Stop)
    tune: Tune = field(default_factory=Tune)
    divergence: Divergence = field(default_factory=Divergence)


def configure_nki_experts(overrides, neuron) -> None:
    """Give the NKI experts override the run's kernel choice and LNC (`--neuron.*`), unless its entry sets them."""
    for i, entry in enumerate(overrides.imports):
        target, kwargs = (entry, {}) if isinstance(entry, str) else entry
        if target == NKI_EXPERTS:
            overrides.imports[i] = (target, {"kernel": neuron.moe_kernel,
                                             "logical_nc_config": neuron.logical_nc_config, **kwargs})


def configure_validation(config) -> None:
    """VALIDATION (`--dataloader.validation`): torchtitan's validator over the whole validation set, with the
    project's loader of it (every rank its share, equal batches), every `--validator.freq` steps."""
    loader = config.dataloader
    if isinstance(loader, data.DataLoader.Config) and loader.validation:
        config.validator.enable, config.validator.steps = True, -1
        config.validator.dataloader = dataclasses.replace(loader, split="validation", infinite=False, epochs=0)


def fail_on_data(error: data.DataError):
    """A bad record or data file: its one line, and exit 2. torchtitan's `@record` (on Trainer.__init__ and train)
    has already written the exception's traceback to torchrun's error file, which torchrun prints in its failure
    table: the one line replaces it there too."""
    line = f"neuron_qwen3: {error}"
    print(line, file=sys.stderr, flush=True)
    path = devices.torchrun_error_file()
    if path:
        with open(path, "w") as f:
            json.dump({"message": {"message": line, "extraInfo": {"py_callstack": line,
                                                                  "timestamp": str(int(time.time()))}}}, f)
    return SystemExit(2)


CPU_FLOAT32 = ("precision: float32 (--training.mixed_precision_param float32{experts}): full scale on CPU, where "
               "bf16 matmuls are emulated; --no-cpu_float32 keeps the config's")


def cpu_float32(config, kind: str) -> str | None:
    """On CPU (`kind`, the device found), a full-scale config computes in float32, as the bench configs do on CPU;
    a config of the user's own (no report.scale) decides its own. Returns the line that says so, or None."""
    if kind != "cpu" or config.report.scale != "full" or not config.cpu_float32:
        return None
    config.training.mixed_precision_param = "float32"
    experts = ""
    for i, entry in enumerate(config.override.imports):  # the nki_moe experts cast to bf16 themselves
        target, kwargs = (entry, {}) if isinstance(entry, str) else entry
        if target == NKI_EXPERTS:
            config.override.imports[i] = (target, {**kwargs, "compute_dtype": "float32"})
            experts = ", nki_moe experts compute_dtype float32"
    return CPU_FLOAT32.format(experts=experts)


class RunHooks(Trainer):
    """The project's overrides of torchtitan's Trainer, in front of it in both trainers' method order."""

    def __init__(self, config):
        kind = devices.set_up(config.device)  # before the trainer touches a device (devices.py)
        line = cpu_float32(config, kind)
        if line:
            logger.info(line)
        self.stop_watch = stop.StopWatch(config.stop.enable)  # a signal during set-up ends the run at step 1
        weights.hf_compatible(config)  # before the model is built (weights.py)
        configure_nki_experts(config.override, config.neuron)
        self.lora = lora_io.resolve(config)  # an initial load naming a PEFT adapter: its base is loaded instead
        if self.lora:
            lora.attach(config, self.lora)  # adapters in before parallelize_fn, the base frozen after it
        if isinstance(config.dataloader, data.DataLoader.Config):  # the chat template of the model trained
            config.dataloader.tokenizer_folder = data.tokenizer_of(config)
            configure_validation(config)
        try:
            super().__init__(config)  # builds the dataloader, which resolves the source
        except data.DataError as error:
            raise fail_on_data(error) from None
        lora.log_state_bytes(self.optimizers, self.model_parts)  # gradients and optimizer bytes, LoRA or not
        self.loss_watch = divergence.attach(self)
        self.stop_watch.join(config.comm)
        self.first_step = None
        self.report = report.RunReport.attach(self)  # $OUTPUT_DIR/report/, through the metrics processor

    def train(self):
        with self.report.watch():  # summary.json says whether the run finished, stopped or failed
            weights.check_coverage(self)  # before the initial load reads Hugging Face keys
            if self.lora:
                lora_io.prepare_checkpoints(self, self.lora)  # the base from INIT_FROM; checkpoints hold adapters
            else:
                weights.initial_load(self)  # INIT_FROM, every rank its own rows (torchtitan's: every attention whole)
            try:
                super().train()
            except divergence.Diverged as diverged:
                logger.error(diverged.args[0])
                self.close()
                raise
            self.validate_last()
            # export.dir: also when the data ran out before training.steps; not after a stop
            lora_io.export(self, self.lora) if self.lora else weights.export(self)

    def init_distributed(self):
        """torchtitan's, then EPOCHS (training.steps from the packed data) and the fine-tuning knobs, whose warm-up
        is a fraction of those steps: after torchtitan's Trainer calls this, it builds the optimizer and schedule."""
        dims = super().init_distributed()
        teardown.at_exit()  # every exit path destroys the process groups (teardown.py)
        same_config.check_same_config(self.config)  # every rank the same config, before anything is built from it
        loader = self.config.dataloader
        if isinstance(loader, data.DataLoader.Config) and loader.epochs:
            plan = data.epochs.plan(self.config, dims.dp_replicate * dims.dp_shard)
            logger.info(f"data: {plan.line}")
            self.config.training.steps = plan.steps
        for line in tuning.apply(self.config):
            logger.info(line)
        return dims

    def validate_last(self) -> None:
        """The validation loss after the last step too, unless the validator's interval has just given it."""
        step = self.step
        if self.config.validator.enable and step == self.config.training.steps \
                and not self.validator.should_validate(step):
            self.validator.validate(self.model_parts, step)

    def batch_generator(self, data_iterable):
        """torchtitan's, with a bad record met while training as its one line and exit 2."""
        try:
            yield from super().batch_generator(data_iterable)
        except data.DataError as error:
            self.close()  # stock torchtitan.train closes the trainer on Exception only, not on SystemExit
            raise fail_on_data(error) from None

    def train_step(self, data_iterator):
        try:
            super().train_step(data_iterator)
        except RuntimeError as error:
            divergence.not_finite(self.loss_watch, error)  # torchtitan's non-finite loss: Diverged, one line
            raise

    def should_continue_training(self) -> bool:
        """torchtitan's test, plus save on stop (stop.py) at each step boundary."""
        if self.first_step is None:
            self.first_step = self.step  # the loaded step: the loop has not begun
        if not super().should_continue_training():
            return False
        signum = self.stop_watch.agreed()
        if signum:
            report.mark_stopped(signal.Signals(signum).name)
            stop.save_now(self.stop_watch, signum, self.checkpointer, self.step, self.first_step)
            self.close()  # stock torchtitan.train closes the trainer on Exception only, not on SystemExit
            raise SystemExit(128 + signum)
        return True

    def close(self) -> None:
        if not getattr(self, "closed", False):
            self.closed = True
            super().close()


class Qwen3Trainer(RunHooks, Trainer):
    """torchtitan's Trainer (native and nki_moe) with the run hooks."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config, RunSettings):
        pass
