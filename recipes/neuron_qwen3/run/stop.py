"""Save on stop: a SIGTERM or SIGINT ends the run at the next step boundary with one full, resumable checkpoint.

torchtitan 0.3.0 has no signal hook: torchrun forwards SIGTERM to the workers, whose default action kills them
mid-step, losing every step since the last CHECKPOINT_INTERVAL. Here a handler only records the signal. At each
step boundary (`RunHooks.should_continue_training`) the ranks agree with a MAX all-reduce of that record on a gloo
side group of their own (a few bytes on the CPU: no device collective joins the step), so a signal that reached
one rank only still stops all of them at the same step. Then every rank writes that step through torchtitan's
checkpointer, the way an interval save does (model, optimizer, learning-rate schedule, data-loader position,
train state), and the worker exits with 128 + the signal's number (143 for SIGTERM). If the save cannot finish
within STOP_GRACE, the launcher's SIGKILL wins: DCP writes `.metadata` last, so the cut save has none, and the
previous complete checkpoint stays the newest one a restart loads.

torchtitan's checkpoint holds no RNG state: a restart seeds as the first start did. The smoke and article models
draw no random numbers after initialisation (no dropout), so the resumed run is the same computation.
"""

import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torchtitan.components.checkpoint import AsyncMode
from torchtitan.tools.logging import logger

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopWatch:
    """Records the first stop signal; `agreed()` is collective: every rank calls it at every step boundary."""

    def __init__(self, enable: bool = True):
        self.signum = 0
        self.received_at = None  # monotonic time of the first signal, for the stop line
        self.group = None
        self.checks = 0  # calls of agreed()
        self.enable = enable
        if enable:  # else torchrun's SIGTERM ends the workers mid-step, as in stock torchtitan
            for signum in SIGNALS:
                signal.signal(signum, self._note)

    def _note(self, signum, _frame):
        if not self.signum:
            self.signum, self.received_at = signum, time.monotonic()

    def join(self, comm):
        """The gloo side group of every rank; collective, so every rank calls it once after the process group.
        A silent peer fails the agreement as it fails torchtitan's own collectives (`comm`, PEER_TIMEOUT): within
        the init timeout until the first step is done, within the train timeout after it."""
        if self.enable and dist.is_initialized() and dist.get_world_size() > 1:
            self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=comm.init_timeout_seconds))
            self.train_timeout = timedelta(seconds=comm.train_timeout_seconds)

    def agreed(self) -> int:
        """The highest signal number any rank has received (0: none): the same answer on every rank."""
        if self.group is None:
            return self.signum
        self.checks += 1
        if self.checks == 2:  # after the first step, which torchtitan ends with a barrier and its train timeouts
            dist.set_timeout(self.train_timeout, self.group)
        flag = torch.tensor([self.signum], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return int(flag.item())


def save_step(checkpointer, step: int) -> bool:
    """Write `step` as torchtitan's interval save would (full state, synchronous), unless it is already written.

    Returns whether a checkpoint was written: False without CHECKPOINT_DIR, or when the interval save of this very
    step has just run (an asynchronous one is waited for).
    """
    if not checkpointer.enable or checkpointer.load_only:
        return False
    checkpointer.maybe_wait_for_saving()
    if step % checkpointer.interval == 0:
        return False
    # the synchronous branch of CheckpointManager._save, which is gated by the interval
    checkpointer.dcp_save(
        checkpointer._flattened_model_states_sd(),
        checkpoint_id=checkpointer._create_checkpoint_id(step),
        async_mode=AsyncMode.DISABLED,
        enable_garbage_collection=True,
    )
    checkpointer._purge_stale_checkpoints()
    return True


def save_now(watch: StopWatch, signum: int, checkpointer, step: int, first_step: int) -> None:
    """Save `step` if it is new since the start, and say so; the caller then exits with 128 + signum."""
    name = signal.Signals(signum).name
    begin = time.monotonic()
    saved = step > first_step and save_step(checkpointer, step)
    spent = f"{time.monotonic() - begin:.2f} s" if saved else "nothing to save"
    since = f"; {time.monotonic() - watch.received_at:.2f} s since the signal" if watch.received_at else ""
    logger.info(
        f"stop: {name} at step {step}: {'saved step-' + str(step) if saved else 'no new checkpoint'} "
        f"({spent}{since}); exiting {128 + signum}"
    )
