"""The project's trainers: torchtitan's Trainer with the run hooks and the project's Config sections (settings.py).

Config functions (config_registry.py) return `Qwen3Trainer.Config` (or v5.py's `Qwen3TransformersTrainer.Config`),
so `config.build()` builds the hooked trainer, and stock `python -m torchtitan.train --module neuron_qwen3 --config
<any>` (the article's command, which the launcher runs) gets every hook: the device set-up, stop with a save on
SIGTERM, the fine-tuning knobs and defaults (tuning.py), the stop on a diverging loss (divergence.py), the run
report and the Hugging Face export. `RunHooks` lists what a step does beyond torchtitan's, in the order it
happens.
"""

import json
import signal
import sys
import time
from dataclasses import dataclass

from torchtitan.tools.logging import logger
from torchtitan.trainer import Trainer

from neuron_qwen3 import data
from neuron_qwen3.attention.masks import DocumentMask
from neuron_qwen3.finish import finish
from neuron_qwen3.hf import weights
from neuron_qwen3.lora import folders, footprint
from neuron_qwen3.moe import routing
from neuron_qwen3.preference import method as preference
from neuron_qwen3.quirks import devices, titan_exit_sleep, titan_logs, worker_exit
from neuron_qwen3.report import data_read, run_report, samples
from neuron_qwen3.rl import rewards, rollout
from neuron_qwen3.rl import validation as grpo_validation
from neuron_qwen3.run import divergence, same_config, stop, teardown, tuning
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
    """The project's overrides of torchtitan's Trainer, in front of it in both trainers' method order.

    torchtitan's loop reaches the project at these seams, each a method below: `post_dataloading_process` (a
    micro-step's data), `training_loss` (its `loss_fn`), `should_log_step` and `log_step` (its metrics processor's
    `should_log` and `log`), `validation_prepare`, `validation_loss` and `log_validation` (the validator's data step
    and loss, and the processor's `log_validation`; under METHOD=grpo `validate_prompts` is the validator's whole
    pass), `should_continue_training` (each step boundary) and `train`.
    The run's extras are plain objects those methods call by name, in the order they are written."""

    def __init__(self, config):
        self.device_kind = devices.set_up(config.device)  # before the trainer touches a device (devices.py)
        titan_logs.install(project_mfu=True)  # torchtitan's A100 peak lines: the run report turns its MFU off
        worker_exit.install()  # a worker that finished ends without the interpreter's 1.6 s finalization
        self.stop_watch = stop.StopWatch(config.stop.enable)  # a signal during set-up ends the run at step 1
        try:
            super().__init__(config)  # init_distributed finishes the config; then the dataloader resolves the source
        except data.DataError as error:
            raise fail_on_data(error) from None
        footprint.log_state_bytes(self.optimizers, self.model_parts)  # gradients and optimizer bytes, LoRA or not
        d = config.divergence
        spikes = config.preference.method != "grpo"
        self.loss_watch = divergence.LossWatch(d.policy, d.window, d.factor, spikes)  # a NaN or a spike stops the run
        self.stop_watch.join(config.comm)
        self.first_step = None
        prepare = self.prepare_inputs  # the data step less the run hooks', for the extras' own forward passes
        try:
            self.dpo, self.held_out_dpo = preference.dpo_losses(self, prepare)  # METHOD=dpo; (None, None) under SFT
            self.grpo, self.rollout = rollout.grpo_parts(self)  # METHOD=grpo; (None, None) otherwise
            self.held_out_grpo = None  # METHOD=grpo's VALIDATION: held-out prompts answered and scored
            if self.rollout is not None and config.validator.enable:
                self.held_out_grpo = grpo_validation.HeldOutPrompts(self, self.rollout)
            self.sampler = samples.Sampler(self) if config.samples.prompts else None  # SAMPLE_PROMPTS
        except (data.DataError, rewards.RewardError) as error:
            raise fail_on_data(error) from None
        dims, model = self.parallel_dims, self.model_parts[0]
        loss_group = dims.get_optional_mesh("loss").get_group() if dims.dp_cp_enabled else None
        self.router_watch = None  # MoE: the router losses and the experts' load (moe/routing.py)
        if routing.moe_layers(model):
            moe = config.moe
            self.router_watch = routing.RouterWatch(
                model, moe.aux_loss, moe.z_loss, self.gradient_accumulation_steps, loss_group
            )
        self.data_read = None  # what the data gave, over the ranks (report/data_read.py): the project's loader only
        if hasattr(self.dataloader, "stats"):
            self.data_read = data_read.DataRead(self.dataloader, loss_group, dims.cp, self.device)
        self.report = run_report.RunReport(self)  # $OUTPUT_DIR/report/
        self.connect_seams()

    def connect_seams(self) -> None:
        """torchtitan's loop calls its loss, its metrics processor and its validator through these attributes:
        each now reaches this trainer's method. The only place the project rebinds an attribute of torchtitan's."""
        processor = self.metrics_processor
        processor.num_flops_per_token = self.report.flops_per_token  # one formula for all three variants (flops.py)
        if self.report.peak.flops is None:
            processor.has_quantization = True  # upstream's one switch for "no MFU" (MetricsProcessor.log)
        else:
            processor.gpu_peak_flops = self.report.peak.flops
        if self.report.backend is not None:
            processor.logger.add_logger(self.report.backend)  # torchtitan's LoggerContainer: metrics.jsonl
        self.cross_entropy = self.loss_fn  # torchtitan's, which its validator holds too
        self.titan_should_log, self.titan_log, self.titan_log_validation = (
            processor.should_log,
            processor.log,
            processor.log_validation,
        )
        self.loss_fn = self.training_loss
        processor.should_log, processor.log, processor.log_validation = (
            self.should_log_step,
            self.log_step,
            self.log_validation,
        )
        if self.held_out_grpo is not None:
            self.validator.validate = self.validate_prompts
        elif self.config.validator.enable:
            self.titan_validation_prepare = self.validator.post_dataloading_process
            self.validator.post_dataloading_process, self.validator.loss_fn = (
                self.validation_prepare,
                self.validation_loss,
            )

    # ---- a training micro-step ----------------------------------------------------------------------------

    def post_dataloading_process(self, input_dict, labels):
        """torchtitan's, less the window's `real` marks, which tell the MoE router watch the tokens that count, a
        pairs window's `record`s and a GRPO row's advantage and generated log-probabilities; with DPO or GRPO's
        KL, the reference's pass on the micro-step (before the router watch records the policy's)."""
        real, records = input_dict.pop("real", None), input_dict.pop("record", None)
        generated = {key: input_dict.pop(key) for key in ("advantages", "old", "learner_old") if key in input_dict}
        inputs, labels, extra = self.prepare_inputs(input_dict, labels)
        if self.dpo is not None:
            self.dpo.reference_pass(inputs, labels, extra, records)
        if self.grpo is not None:
            self.grpo.prepare(inputs, labels, extra, generated)
        if self.router_watch is not None:
            self.router_watch.start(real)
        return inputs, labels, extra

    def prepare_inputs(self, input_dict, labels):
        """torchtitan's data step; under document attention (attention/), each window's DocumentMask is the
        attention mask, built here as torchtitan builds its BlockMask there."""
        inputs, labels, extra = super().post_dataloading_process(input_dict, labels)
        return inputs, labels, self.with_document_mask(extra)

    def with_document_mask(self, extra: dict) -> dict:
        if self.document_attention and extra.get("positions") is not None:
            extra["attention_masks"] = DocumentMask.of(extra["positions"])
        return extra

    def training_loss(self, pred, labels, global_valid_tokens, **kwargs):
        """What a micro-step trains on: the data's cross-entropy, the DPO loss under METHOD=dpo, or the GRPO loss
        under METHOD=grpo; then, on a MoE model, the router losses (load balancing, z) added."""
        objective = next((o for o in (self.dpo, self.grpo) if o is not None), self.cross_entropy)
        loss, *rest = objective(pred, labels, global_valid_tokens, **kwargs)
        if self.router_watch is not None:
            loss = loss + self.router_watch.loss().to(loss.device, loss.dtype)
        return loss, *rest

    # ---- a logged step ------------------------------------------------------------------------------------

    def should_log_step(self, step: int) -> bool:
        """torchtitan's log frequency, and every step its checkpointer saves: a saved step has been judged."""
        return self.titan_should_log(step) or divergence.saved(self.config.checkpoint, self.config.training.steps, step)

    def log_step(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        """A logged step: each watcher's interval over the ranks (collectives: every rank, in this order), its
        metrics beside torchtitan's, torchtitan's log and loggers (the run report's among them), then the loss
        judged (a spike or a NaN stops the run before this step is saved)."""
        extra = dict(extra_metrics or {})
        if self.data_read is not None:
            self.data_read.gather()  # summary.json's `data`
        if self.router_watch is not None:
            load = self.router_watch.interval()
            extra.update(routing.metrics(load) if load else {})
        if self.dpo is not None:
            extra.update(self.dpo.interval() or {})
        if self.grpo is not None:
            self.write_samples(self.rollout.take_shown())
            extra.update(self.rollout.interval())
            extra.update(self.grpo.interval())
        self.titan_log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra)
        self.loss_watch.judge(step, global_avg_loss)

    # ---- validation ---------------------------------------------------------------------------------------

    def validation_prepare(self, input_dict, labels, model_parts):
        """The validator's data step (torchtitan's), with DPO's reference pass on the held-out pairs after it."""
        records = input_dict.pop("record", None)
        inputs, labels, extra = self.titan_validation_prepare(input_dict, labels, model_parts)
        extra = self.with_document_mask(extra)
        if self.held_out_dpo is not None:
            self.held_out_dpo.reference_pass(inputs, labels, extra, records)
        return inputs, labels, extra

    def validation_loss(self, pred, labels, *args, **kwargs):
        """The validation's loss: the cross-entropy, or the held-out pairs' DPO loss (no router losses)."""
        objective = self.held_out_dpo if self.held_out_dpo is not None else self.cross_entropy
        return objective(pred, labels, *args, **kwargs)

    def validate_prompts(self, model_parts, step):
        """The validator's pass under METHOD=grpo: the held-out prompts answered greedily and scored, the negated
        mean reward its loss (rl/validation.py)."""
        loss, found, rows = self.held_out_grpo.validate(step)
        self.write_samples(rows)
        self.metrics_processor.log_validation(loss=loss, step=step, extra_metrics=found)

    def write_samples(self, rows: list) -> None:
        """GRPO's scored completions (rank 0's) into the run's samples files (report/samples.py)."""
        if rows:
            samples.append_rows(samples.folder_of(self.config), rows)

    def log_validation(self, loss, step, extra_metrics=None):
        """torchtitan's validation log; with DPO its loss is the pairs' mean DPO loss, their rewards beside it."""
        extra = dict(extra_metrics or {})
        if self.held_out_dpo is not None:
            loss, found = preference.validation_metrics(self.held_out_dpo)  # every rank: a collective
            extra.update(found)
        self.titan_log_validation(loss, step, extra_metrics=extra)

    # ---- the run ------------------------------------------------------------------------------------------

    def train(self):
        with self.report.watch():  # summary.json says whether the run finished, stopped or failed
            weights.check_coverage(self)  # before the initial load reads Hugging Face keys
            if self.lora:
                folders.prepare_checkpoints(self, self.lora)  # the base from INIT_FROM; checkpoints hold adapters
            else:
                weights.initial_load(self)  # INIT_FROM, every rank its own rows (torchtitan's: every attention whole)
            try:
                with titan_exit_sleep.skipped():  # rank 0's 2 s wait at its end (quirks/titan_exit_sleep.py)
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
        finished = finish(self.config, dims.world_size, self.device_kind, tuning.typed_flags(sys.argv[1:]))
        for line in finished.lines:
            logger.info(line)
        self.lora, self.document_attention = finished.lora, finished.document_attention
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

    def batch_generator(self, data_iterable):
        """torchtitan's, or under METHOD=grpo the rollout's micro-batches of generated completions; a bad record
        or a failing reward function met while training is its one line and exit 2."""
        try:
            if self.rollout is not None:
                yield from self.rollout.batches(iter(data_iterable))
            else:
                yield from super().batch_generator(data_iterable)
        except (data.DataError, rewards.RewardError) as error:
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
            elif self.rollout is not None and samples.writes():  # GRPO's completions go to the samples too
                samples.restart_rows(samples.folder_of(self.config), self.step)
        if not super().should_continue_training():
            return False
        signum = self.stop_watch.agreed()
        if signum:
            run_report.mark_stopped(signal.Signals(signum).name)
            stop.save_now(self.stop_watch, signum, self.checkpointer, self.step, self.first_step)
            self.close()  # stock torchtitan.train closes the trainer on Exception only, not on SystemExit
            raise SystemExit(128 + signum)
        return True

    def state_dict(self) -> dict:
        """torchtitan's train state, and under METHOD=grpo this rank's generation still being trained on."""
        state = super().state_dict()
        if getattr(self, "rollout", None) is not None:
            state.update(self.rollout.state_dict())
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        if getattr(self, "rollout", None) is not None:
            self.rollout.load_state_dict(state_dict)

    def close(self) -> None:
        if not getattr(self, "closed", False):
            self.closed = True
            super().close()


class Qwen3Trainer(RunHooks, Trainer):
    """torchtitan's Trainer (native and nki_moe) with the run hooks."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config, RunSettings):
        pass
