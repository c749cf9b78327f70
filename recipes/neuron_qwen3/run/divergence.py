"""Early signal of a broken run: a NaN or infinite loss, or a spike far above the recent losses, stops it at once.

Judged on the global loss at each logged step, which every rank holds identically (torchtitan all-reduces it), so
all ranks decide alike and exit together: no collective of its own, no hang. The check runs inside the step, before
torchtitan's checkpointer saves that step, so the newest checkpoint stays the last good one. Checkpoint steps are
always logged (hence checked), whatever `metrics.log_freq` says: a step that is saved has been judged first.

- Not finite: torchtitan 0.3.0 itself raises `RuntimeError("Loss is not finite ...")` at a logged step, as a
  traceback on every rank; here it becomes one line and exit DIVERGED, whatever the policy: the optimizer has already
  written that step's gradients into the weights, so there is nothing to go on with (and each later save would
  push a good checkpoint out).
- A spike: the loss is above median + factor x spread of the last `window` logged losses, where spread is their
  median absolute deviation, at least 3 % of the median (a flat curve's tiny MAD must not turn noise into a stop);
  judged once MIN_HISTORY logged losses are behind it. The defaults, window 20 and factor 10, flag a jump of ten
  typical deviations (about 6.7 sigma for Gaussian noise) and of at least 30 % of the loss, so that one harder batch
  does not end a run. `stop` (NAN_POLICY=stop): one line, exit DIVERGED; `warn`: one warning line, and the run goes
  on.
"""

import math
import re
import statistics
from collections import deque

from torchtitan.tools.logging import logger

from neuron_qwen3.settings import MIN_HISTORY

DIVERGED = 3  # the worker's exit status; torchrun, and so the launcher, then exit 1 as for any failed worker
RELATIVE_FLOOR = 0.03
TORCHTITAN_NOT_FINITE = re.compile(r"Loss is not finite \(global_avg_loss=(\S+?)\) at step (\d+)")


class Diverged(SystemExit):
    """The run stops on its loss: exit DIVERGED, its message the one line (the run report's end detail)."""

    def __init__(self, line: str):
        super().__init__(line)
        self.code = DIVERGED


class LossWatch:
    def __init__(self, policy: str = "stop", window: int = 20, factor: float = 10.0, spikes: bool = True):
        """`window` and `factor` as settings.Divergence checks them; `spikes=False` judges a non-finite loss only
        (GRPO's surrogate loss sits near 0 and swings with every batch's advantages: no spike means anything)."""
        self.policy, self.factor, self.spikes = policy, factor, spikes
        self.losses = deque(maxlen=window)

    def verdict(self, step: int, loss: float) -> str | None:
        """What is wrong with `loss` at `step` (None: nothing); the loss joins the history when finite."""
        if not math.isfinite(loss):
            return f"step {step}: the loss is {loss}"
        history, line = list(self.losses), None
        self.losses.append(loss)
        if self.spikes and len(history) >= MIN_HISTORY:
            median = statistics.median(history)
            spread = max(statistics.median(abs(x - median) for x in history), RELATIVE_FLOOR * abs(median))
            limit = median + self.factor * spread
            if loss > limit:
                line = (
                    f"step {step}: the loss {loss:.4f} jumped above {limit:.4f} (median {median:.4f} + "
                    f"{self.factor:g} x spread {spread:.4f} of the last {len(history)} logged losses)"
                )
        return line

    def judge(self, step: int, loss: float) -> None:
        """Nothing, a warning line (a spike under `warn`), or Diverged."""
        line = self.verdict(step, loss)
        if line is None:
            return
        finite = math.isfinite(loss)
        if finite and self.policy == "warn":
            logger.warning(f"divergence: {line}: going on (NAN_POLICY=warn)")
            return
        raise Diverged(
            f"divergence: {line}: stopping before this step is saved (exit {DIVERGED}"
            f"{'; NAN_POLICY=warn goes on after a spike' if finite else ''})"
        )


def saved(checkpoint, steps: int, step: int) -> bool:
    """Whether torchtitan's checkpointer saves `step`: such a step is logged, so judged, before it is saved."""
    return checkpoint.enable and not checkpoint.load_only and (step % checkpoint.interval == 0 or step == steps)


def not_finite(watch: LossWatch, error: RuntimeError) -> None:
    """torchtitan's non-finite-loss error as the one line (raises Diverged); any other error returns."""
    found = TORCHTITAN_NOT_FINITE.search(str(error))
    if found:
        watch.judge(int(found[2]), float(found[1]))
