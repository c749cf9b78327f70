"""The project's trainers: torchtitan's Trainer with the run hooks and the project's Config sections.

Config functions (config_registry.py) return `Qwen3Trainer.Config` (or v5.py's `Qwen3TransformersTrainer.Config`),
so `config.build()` builds the hooked trainer, and stock `python -m torchtitan.train --module neuron_qwen3 --config
<any>` (the article's command, which the launcher runs) gets every hook: the device set-up, stop with a save on
SIGTERM, the run report and the Hugging Face export. The sections below are the project's flags, as torchtitan's
fault-tolerance trainer adds `--fault_tolerance.*`: `--export.dir`, `--neuron.logical_nc_config`, ...
"""

import signal
from dataclasses import dataclass, field
from typing import Annotated, Literal

import tyro
from torchtitan.trainer import Trainer

from neuron_qwen3 import devices, lora, lora_io, report, same_config, stop, weights

# The override.imports entry that swaps the nki_moe experts (moe/experts.py), named here without importing it: a
# torchtitan without the override registry still runs the other variants.
NKI_EXPERTS = "neuron_qwen3.moe.experts.nki_grouped_experts"


@dataclass(kw_only=True, slots=True)
class Export:
    dir: str = ""
    """After training (also when the data runs out), a Hugging Face model folder here (config.json, safetensors,
    tokenizer), written atomically; empty: no export."""
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """dtype of the exported weights"""
    merged: Annotated[bool, tyro.conf.FlagConversionOff] = False
    """With LoRA: the merged full model (as without LoRA), the adapter in `<dir>/adapter`; False: the PEFT adapter
    folder alone. `--export.merged=True` (a value, as the launcher passes every variable)."""


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


@dataclass(kw_only=True)
class RunSettings:
    """The project's sections, shared by the Configs of both trainers (a plain dataclass mixin: two slotted bases
    cannot share fields)."""

    device: Literal["auto", "neuron", "cuda", "cpu"] = "auto"
    """Where this worker trains; auto: Neuron if torch_neuronx imports, else CUDA, else CPU."""
    export: Export = field(default_factory=Export)
    lora: Lora = field(default_factory=Lora)
    neuron: Neuron = field(default_factory=Neuron)
    report: Report = field(default_factory=Report)
    stop: Stop = field(default_factory=Stop)


def configure_nki_experts(overrides, neuron) -> None:
    """Give the NKI experts override the run's kernel choice and LNC (`--neuron.*`), unless its entry sets them."""
    for i, entry in enumerate(overrides.imports):
        target, kwargs = (entry, {}) if isinstance(entry, str) else entry
        if target == NKI_EXPERTS:
            overrides.imports[i] = (target, {"kernel": neuron.moe_kernel,
                                             "logical_nc_config": neuron.logical_nc_config, **kwargs})


class RunHooks(Trainer):
    """The project's overrides of torchtitan's Trainer, in front of it in both trainers' method order."""

    def __init__(self, config):
        devices.set_up(config.device)  # before the trainer touches a device (devices.py)
        self.stop_watch = stop.StopWatch(config.stop.enable)  # a signal during set-up ends the run at step 1
        weights.hf_compatible(config)  # before the model is built (weights.py)
        configure_nki_experts(config.override, config.neuron)
        self.lora = lora_io.resolve(config)  # an initial load naming a PEFT adapter: its base is loaded instead
        if self.lora:
            lora.attach(config, self.lora)  # adapters in before parallelize_fn, the base frozen after it
        super().__init__(config)
        lora.log_state_bytes(self.optimizers, self.model_parts)  # gradients and optimizer bytes, LoRA or not
        self.stop_watch.join(config.comm)
        self.first_step = None
        self.report = report.RunReport.attach(self)  # $OUTPUT_DIR/report/, through the metrics processor

    def init_distributed(self):
        parallel_dims = super().init_distributed()
        same_config.check_same_config(self.config)  # every rank the same config, before anything is built from it
        return parallel_dims

    def train(self):
        with self.report.watch():  # summary.json says whether the run finished, stopped or failed
            weights.check_coverage(self)  # before the initial load reads Hugging Face keys
            if self.lora:
                lora_io.prepare_checkpoints(self, self.lora)  # the base from INIT_FROM; checkpoints hold adapters
            super().train()
            # export.dir: also when the data ran out before training.steps; not after a stop
            lora_io.export(self, self.lora) if self.lora else weights.export(self)

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
