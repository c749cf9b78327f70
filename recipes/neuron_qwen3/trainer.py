"""The project's trainers: torchtitan's Trainer with the run hooks and the project's Config sections.

Config functions (config_registry.py) return `Qwen3Trainer.Config` (or v5.py's `Qwen3TransformersTrainer.Config`),
so `config.build()` builds the hooked trainer, and stock `python -m torchtitan.train --module neuron_qwen3 --config
<any>` (the article's command, which the launcher runs) gets every hook: the device set-up, stop with a save on
SIGTERM, the fine-tuning knobs and defaults (tuning.py), the stop on a diverging loss (divergence.py), the run
report and the Hugging Face export. The sections below are the project's flags, as torchtitan's
fault-tolerance trainer adds `--fault_tolerance.*`: `--export.dir`, `--neuron.logical_nc_config`, ...
"""

import json
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Annotated, Literal

import tyro
from torchtitan.tools.logging import logger
from torchtitan.trainer import Trainer

from neuron_qwen3 import data
from neuron_qwen3.finish import finish
from neuron_qwen3.hf import weights
from neuron_qwen3.lora import folders, footprint
from neuron_qwen3.moe import routing
from neuron_qwen3.preference import attach as preference_attach
from neuron_qwen3.quirks import devices, titan_logs
from neuron_qwen3.report import data_read, run_report, samples
from neuron_qwen3.run import divergence, same_config, stop, teardown


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
    """Train LoRA adapters of this rank over the initial load's frozen weights (lora/adapters.py); 0: full
    fine-tuning."""
    alpha: float = 0.0
    """The update is scaled by alpha / rank; 0: 2 x rank."""
    dropout: float = 0.0
    """Dropout on the adapters' input (not on MoE experts: PEFT has none there)."""
    targets: str = ""
    """Comma list of the Hugging Face projections adapted (adapters.TARGETS); empty: the attention and MLP projections
    on dense models, the attention projections on MoE."""


@dataclass(kw_only=True, slots=True)
class Neuron:
    logical_nc_config: int = 2
    """Physical NeuronCores per logical core (NEURON_LOGICAL_NC_CONFIG): the NKI kernels' and the MFU peak's LNC."""
    moe_kernel: Literal["auto", "nki", "reference"] = "auto"
    """nki_moe expert kernel: auto is NKI on Neuron and the PyTorch reference elsewhere."""


@dataclass(kw_only=True, slots=True)
class Moe:
    aux_loss: float | None = None
    """MOE_AUX_LOSS: the coefficient of Qwen3-MoE's load-balancing loss added to the loss (moe/routing.py); None:
    INIT_FROM's config.json router_aux_loss_coef, else Qwen3-MoE's 0.001 (finish.py); 0: off."""
    z_loss: float = 0.0
    """MOE_Z_LOSS: the coefficient of the router z-loss (ST-MoE)."""
    router: Literal["train", "freeze"] = "train"
    """MOE_ROUTER: freeze keeps every router's weights as loaded (INIT_FROM), out of the optimizer."""


@dataclass(kw_only=True, slots=True)
class Preference:
    method: Literal["sft", "dpo"] = "sft"
    """METHOD: sft trains on the data's tokens; dpo on preference pairs (chosen and rejected, data/pairs.py) against
    a reference model (preference/)."""
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
class Samples:
    prompts: str = ""
    """SAMPLE_PROMPTS: a local file of conversations (DATASET's formats; `enable_thinking` per record) that the
    model answers greedily at step 0, every `every` steps and after the last step (report/samples.py); empty:
    none."""
    tokens: int = 48
    """SAMPLE_TOKENS: the most new tokens an answer takes; it stops sooner at the template's end of turn."""
    every: int = 0
    """SAMPLE_INTERVAL: steps between samples; 0: the validation interval with validation, else none between
    step 0 and the last."""


@dataclass(kw_only=True, slots=True)
class Stop:
    enable: bool = True
    """On SIGTERM/SIGINT, finish the step, save it on every rank (with --checkpoint.enable) and exit 128 + N."""


@dataclass(kw_only=True, slots=True)
class Tune:
    lr: float | None = None
    """Learning rate of every optimizer param group (LR); None: the config's, 2e-5 with checkpoint.initial_load_path
    (a fine-tune: run/tuning.py)."""
    warmup: float | None = None
    """Warm-up (WARMUP_STEPS): whole steps, or a fraction of training.steps below 1; None: lr_scheduler.warmup_steps,
    8 % of the steps with checkpoint.initial_load_path (a fine-tune: run/tuning.py)."""


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
    moe: Moe = field(default_factory=Moe)
    neuron: Neuron = field(default_factory=Neuron)
    preference: Preference = field(default_factory=Preference)
    report: Report = field(default_factory=Report)
    samples: Samples = field(default_factory=Samples)
    stop: Stop = field(default_factory=Stop)
    tune: Tune = field(default_factory=Tune)
    divergence: Divergence = field(default_factory=Divergence)


def fail_on_data(error: data.DataError):
    """A bad record or data file: its one line, and exit 2. torchtitan's `@record` (on Trainer.__init__ and train)
    has already written the exception's traceback to torchrun's error file, which torchrun prints in its failure
    table: the one line replaces it there too."""
    line = f"neuron_qwen3: {error}"
    print(line, file=sys.stderr, flush=True)
    path = devices.torchrun_error_file()
    if path:
        with open(path, "w") as f:
            json.dump(
                {"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}},
                f,
            )
    return SystemExit(2)


class RunHooks(Trainer):
    """The project's overrides of torchtitan's Trainer, in front of it in both trainers' method order."""

    def __init__(self, config):
        self.device_kind = devices.set_up(config.device)  # before the trainer touches a device (devices.py)
        titan_logs.install(project_mfu=True)  # torchtitan's A100 peak lines: RunReport.attach turns its MFU off
        self.stop_watch = stop.StopWatch(config.stop.enable)  # a signal during set-up ends the run at step 1
        try:
            super().__init__(config)  # init_distributed finishes the config; then the dataloader resolves the source
        except data.DataError as error:
            raise fail_on_data(error) from None
        footprint.log_state_bytes(self.optimizers, self.model_parts)  # gradients and optimizer bytes, LoRA or not
        self.loss_watch = divergence.attach(self)
        self.stop_watch.join(config.comm)
        self.first_step = None
        try:
            # METHOD=dpo: the loss (before the router's joins it), the reference
            self.preference = preference_attach.attach(self, super().post_dataloading_process)
        except data.DataError as error:
            raise fail_on_data(error) from None
        self.router_watch = routing.attach(self)  # MoE: the router losses and the experts' load (moe/routing.py)
        self.data_read = data_read.attach(self)  # what the data gave, over the ranks (report/data_read.py)
        try:
            self.sampler = samples.attach(self, super().post_dataloading_process)  # SAMPLE_PROMPTS' answers
        except data.DataError as error:
            raise fail_on_data(error) from None
        self.report = run_report.RunReport.attach(self)  # $OUTPUT_DIR/report/, through the metrics processor

    def train(self):
        with self.report.watch():  # summary.json says whether the run finished, stopped or failed
            weights.check_coverage(self)  # before the initial load reads Hugging Face keys
            if self.lora:
                folders.prepare_checkpoints(self, self.lora)  # the base from INIT_FROM; checkpoints hold adapters
            else:
                weights.initial_load(self)  # INIT_FROM, every rank its own rows (torchtitan's: every attention whole)
            try:
                super().train()
            except divergence.Diverged as diverged:
                logger.error(diverged.args[0])
                self.close()
                raise
            self.validate_last()
            if self.sampler:
                self.sampler.sample(self.step)  # after the last step (also when the data ran out)
            # export.dir: also when the data ran out before training.steps; not after a stop
            folders.export(self, self.lora) if self.lora else weights.export(self)

    def init_distributed(self):
        """torchtitan's, then the config finished (finish.py) for this world before anything is built from it:
        torchtitan's Trainer calls this first in its __init__."""
        dims = super().init_distributed()
        teardown.at_exit()  # every exit path destroys the process groups (teardown.py)
        same_config.check_same_config(self.config)  # every rank the same flags, before anything is derived from them
        finished = finish(self.config, dims.world_size, self.device_kind)
        for line in finished.lines:
            logger.info(line)
        self.lora = finished.lora
        self.finished_config = self.config.to_dict()  # before torchtitan fills in its model's build details
        return dims

    def validate_last(self) -> None:
        """The validation loss after the last step too, unless the validator's interval has just given it."""
        step = self.step
        if (
            self.config.validator.enable
            and step == self.config.training.steps
            and not self.validator.should_validate(step)
        ):
            self.validator.validate(self.model_parts, step)

    def post_dataloading_process(self, input_dict, labels):
        """torchtitan's, less the window's `real` marks, which tell the MoE router watch the tokens that count, and
        a pairs window's `record`s; with DPO, the reference's pass on the micro-step (before the router watch
        records the policy's)."""
        real, records = input_dict.pop("real", None), input_dict.pop("record", None)
        inputs, labels, extra = super().post_dataloading_process(input_dict, labels)
        if self.preference is not None:
            self.preference.reference_pass(inputs, labels, extra, records)
        if self.router_watch is not None:
            self.router_watch.start(real)
        return inputs, labels, extra

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
        if self.sampler and self.sampler.due(self.step):
            self.sampler.sample(self.step)

    def should_continue_training(self) -> bool:
        """torchtitan's test, plus save on stop (stop.py) at each step boundary."""
        if self.first_step is None:
            self.first_step = self.step  # the loaded step: the loop has not begun
            if self.sampler:
                self.sampler.begin(self.step)  # step 0's answers, or a resumed run's samples go on
        if not super().should_continue_training():
            return False
        signum = self.stop_watch.agreed()
        if signum:
            run_report.mark_stopped(signal.Signals(signum).name)
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
