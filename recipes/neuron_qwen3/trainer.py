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
from dataclasses import dataclass

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
from neuron_qwen3.settings import RunSettings


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
