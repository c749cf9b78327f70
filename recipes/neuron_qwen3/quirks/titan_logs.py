"""Three torchtitan 0.3.0 log lines that are untrue of this project's runs, corrected on torchtitan's own logger.

torchtitan logs through the root logger (torchtitan/tools/logging.py: `logger = logging.getLogger()`), so a filter
on that logger sees torchtitan's records before any handler, and `init_logger` (which clears the handlers only)
keeps it. The filter matches each line by its exact text and level, and nothing else.

1. "initial_load_model_only=True has no effect without an initial_load_path." (WARNING) comes from
   `BaseCheckpointManager.Config.__post_init__` (components/checkpointer/base.py:335-338). It fires every time a
   checkpoint Config is built with no initial_load_path and `initial_load_model_only` at its default, True, so it
   cannot tell that default from a user's flag. It comes while the config is being parsed, not at a load. The
   Config built by torchtitan's qwen3 config function (models/qwen3/config_registry.py:226, called by every
   native/nki_moe config here) warns before the command line's `--checkpoint.initial_load_path` is applied. tyro
   builds the parsed one, and `Configurable.Config.build`'s `replace(self)` (config/configurable.py:151) builds it
   again in the Trainer. An INIT_FROM run prints it once, from the config function: untrue, because the run has a
   path and the launcher passes `--checkpoint.initial_load_model_only` only next to one (entrypoint/plan.py). Any
   other run prints it three times, about a default nobody set. It is dropped in both cases (`install`, from
   config_registry's import on, before any config function runs). hf/weights.py setting
   `checkpointer.initial_load_path = None` after its own load plays no part in this: it happens after every Config
   is built, and on the manager, not on a Config. The true line is already logged there ("Loaded the Hugging
   Face weights of ... (torchtitan's checkpointer ... then calls it a fresh start)").

2. torchtitan's peak FLOPS on a device that is not in its table (a host CPU, where its device name is "cpu", or a
   GPU it does not list). `get_peak_flops` (tools/utils.py:258; 253 for TPU) warns "Peak flops undefined for: cpu,
   fallback to A100" and returns the A100's 312e12. It is called twice: in `MetricsProcessor.__init__`
   (components/metrics.py:347) and in `Trainer.__init__` (trainer.py:539), which then logs "Peak FLOPS used for
   computing MFU: 3.120e+14" (trainer.py:540). The project's trainer never uses that figure:
   `run_report.RunReport.attach` takes the peak from report/flops.py, which has none for such a device, and turns
   torchtitan's MFU off (`has_quantization`, the upstream switch). The step lines say "mfu: N/A" and summary.json
   says mfu null. With `install(project_mfu=True)`, which the project's trainer calls before torchtitan's
   Trainer.__init__, both fallback warnings are dropped and the "Peak FLOPS used" line is replaced by the true one:
   "Peak FLOPS used for computing MFU: none (CPU: no agreed peak FLOPS for a host CPU, so no MFU) ...". Without
   `project_mfu` (a stock torchtitan trainer, which does divide by the A100 figure), these lines pass unchanged.

tests/test_titan_logs.py shows that stock torchtitan logs each line in the same situation and that none is logged
with the filter on.
"""

import collections
import logging
import re

from torchtitan.tools.logging import logger as titan_logger  # the root logger

MODEL_ONLY = "initial_load_model_only=True has no effect without an initial_load_path."  # base.py:337, WARNING
A100_FALLBACK = re.compile(r"Peak flops undefined for(?: TPU)?: (?P<device>.*), fallback to A100")  # utils.py, WARNING
PEAK_USED = "Peak FLOPS used for computing MFU: "  # trainer.py:540, INFO, followed by the figure
NO_PEAK = (PEAK_USED + "none ({reason}); torchtitan's A100 fallback is not used: its step lines say mfu: N/A, the "
           "run report's mfu is null")


class TitanLogs(logging.Filter):
    """Drops or corrects the torchtitan records above; `corrected` counts, by torchtitan's text, what it changed."""

    def __init__(self):
        super().__init__()
        self.project_mfu = False  # the project's run report decides MFU (RunReport.attach follows)
        self.fallback: str | None = None  # the device get_peak_flops last gave the A100 figure for
        self.corrected = collections.Counter()

    def filter(self, record: logging.LogRecord) -> bool:
        # torchtitan logs these three as f-strings or literals: the text is record.msg, with no args
        if record.args or not isinstance(record.msg, str):
            return True
        message = record.msg
        if record.levelno == logging.WARNING and message == MODEL_ONLY:
            self.corrected[message] += 1
            return False
        if not self.project_mfu:
            return True
        if record.levelno == logging.WARNING:
            match = A100_FALLBACK.fullmatch(message)
            if match:
                self.fallback = match["device"]
                self.corrected[message] += 1
                return False
        elif record.levelno == logging.INFO and message.startswith(PEAK_USED) and self.fallback is not None:
            self.corrected[message] += 1
            record.msg = NO_PEAK.format(reason=_no_peak_reason(self.fallback))
            self.fallback = None
        return True


def _no_peak_reason(device_name: str) -> str:
    """Why there is no MFU, as the run report says it (flops.peak), for a device torchtitan fell back for."""
    from torchtitan.tools import utils

    if utils.device_type == "cpu":
        from neuron_qwen3.report import flops

        return flops.peak("cpu", device_name).source  # no torchtitan lookup on CPU: nothing logged from here
    return f"{device_name!r} is not in torchtitan's peak table"  # flops.peak's words, without calling it again


_filter: TitanLogs | None = None


def install(*, project_mfu: bool = False) -> TitanLogs:
    """Put the filter on torchtitan's logger, once per process (a later call returns the same filter).
    `project_mfu=True`: the caller is the project's trainer, whose run report replaces torchtitan's peak (item 2);
    it stays set for the process."""
    global _filter
    if _filter is None:
        _filter = TitanLogs()
    if _filter not in titan_logger.filters:
        titan_logger.addFilter(_filter)
    _filter.project_mfu = _filter.project_mfu or project_mfu
    return _filter


def uninstall() -> None:
    """Take the filter off (tests: stock torchtitan's lines back)."""
    global _filter
    if _filter is not None:
        titan_logger.removeFilter(_filter)
    _filter = None
