"""torchtitan's training `main`, building the trainer with this project's run hooks mixed in.

torchtitan 0.3.0's `torchtitan.train.main` builds whatever trainer class the config owns (`config.build()`:
`Trainer`, or `HFTransformerTrainer` for the v5 backend) and offers no hook around the training loop. The
capabilities that need one (stop with a save on SIGTERM, the run report, the Hugging Face export) override
methods of `RunHooks`, which is mixed in front of the config's own trainer class, so all three variants get them
on every device. Every worker ends here: `python -m neuron_qwen3.trainer` on CUDA, and the CPU and Neuron workers
after their device set-up.
"""

import dataclasses
import signal

import torch
from torchtitan.config import ConfigManager
from torchtitan.observability import structured_logger as sl
from torchtitan.tools.logging import init_logger, logger
from torchtitan.trainer import Trainer

from neuron_qwen3 import report, stop, weights


class RunHooks(Trainer):
    """The project's overrides of torchtitan's Trainer; mixed in by `with_run_hooks`."""

    def __init__(self, config):
        self.stop_watch = stop.StopWatch()  # first: a signal during set-up ends the run at the first boundary
        weights.hf_compatible(config)  # before the model is built (weights.py)
        super().__init__(config)
        self.stop_watch.join()
        self.first_step = None
        self.report = report.RunReport.attach(self)  # $OUTPUT_DIR/report/, through the metrics processor

    def train(self):
        with self.report.watch():  # summary.json says whether the run finished, stopped or failed
            weights.check_coverage(self)  # before the initial load reads Hugging Face keys
            super().train()
            weights.export(self)  # EXPORT_DIR: also when the data ran out before training.steps; not after a stop

    def should_continue_training(self) -> bool:
        """torchtitan's test, plus save on stop (stop.py) at each step boundary."""
        if self.first_step is None:
            self.first_step = self.step  # the loaded step: the loop has not begun
        if not super().should_continue_training():
            return False
        signum = self.stop_watch.agreed()
        if signum:
            report.mark_stopped(signal.Signals(signum).name)
            stop.stop_now(self.stop_watch, signum, self.checkpointer, self.step, self.first_step)
        return True


def with_run_hooks(owner: type) -> type:
    """`owner` (the config's trainer class) with RunHooks in front of it in the method order."""
    assert issubclass(owner, Trainer), f"{owner} is not a torchtitan Trainer"
    return type(f"NeuronQwen3{owner.__name__}", (RunHooks, owner), {})


def main() -> None:
    """`torchtitan.train.main` (0.3.0), with `config.build()` replaced by the hooked trainer class."""
    init_logger()
    config = ConfigManager().parse_args()
    sl.init_structured_logger(source="training", output_dir=config.dump_folder,
                              enable=config.debug.enable_structured_logging)
    assert not config.checkpoint.create_seed_checkpoint, "seed checkpoints: use `python -m torchtitan.train`"
    trainer = None
    try:
        # what Config.build() does, with the hooked class (build() copies the config first, so do we)
        trainer = with_run_hooks(type(config)._owner)(config=dataclasses.replace(config))
        trainer.train()
    except BaseException:
        if trainer:
            trainer.close()
        raise
    trainer.close()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    logger.info("Process group destroyed")


if __name__ == "__main__":
    main()
