"""torchtitan 0.3.0 log lines that are untrue of this project's runs, corrected by a filter on torchtitan's logger.

torchtitan logs through the root logger (tools/logging.py), so a filter there sees its records before any
handler and survives `init_logger`. Each line is matched by its exact text and level:

1. "initial_load_model_only=True has no effect without an initial_load_path." (WARNING): the checkpoint Config's
   __post_init__ (components/checkpointer/base.py) warns whenever one is built without a path, which the qwen3
   config function does before the command line's INIT_FROM applies, and tyro and `Config.build` do again.
   The project loads INIT_FROM itself and says so (hf/weights.py); the line is dropped.
2. On a device torchtitan's peak table lacks (a host CPU), `get_peak_flops` (tools/utils.py) warns "Peak flops
   undefined for: cpu, fallback to A100" twice and the Trainer logs "Peak FLOPS used for computing MFU:
   3.120e+14". The project's run report turns torchtitan's MFU off there (report/run_report.py), so with
   `install(project_mfu=True)` (the project's trainer) the warnings are dropped and the peak line says why
   there is none.

tests/test_titan_logs.py shows stock torchtitan logs each line in the same situation and none is left.
"""

import collections
import logging
import re

from torchtitan.tools.logging import logger as titan_logger  # the root logger

MODEL_ONLY = "initial_load_model_only=True has no effect without an initial_load_path."  # base.py:337, WARNING
A100_FALLBACK = re.compile(r"Peak flops undefined for(?: TPU)?: (?P<device>.*), fallback to A100")  # utils.py, WARNING
PEAK_USED = "Peak FLOPS used for computing MFU: "  # trainer.py:540, INFO, followed by the figure
NO_PEAK = (
    PEAK_USED + "none ({reason}); torchtitan's A100 fallback is not used: its step lines say mfu: N/A, the "
    "run report's mfu is null"
)


class TitanLogs(logging.Filter):
    """Drops or corrects the torchtitan records above; `corrected` counts, by torchtitan's text, what it changed."""

    def __init__(self):
        super().__init__()
        self.project_mfu = False  # the project's run report decides MFU (the trainer's RunReport follows)
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
