"""torchtitan 0.3.0's `Trainer.train()` ends with rank 0 sleeping 2 s "for other ranks to complete"
(torchtitan/trainer.py), in every run. Here that wait buys nothing: the trainer's own train() goes on to
collectives after it (the last validation, the samples, the export), and the workers' exit destroys the process
groups (run/teardown.py), where the ranks meet anyway. So while torchtitan's train() runs, its module's `time`
is the real one but for `sleep`, which returns at once: it is the only sleep in that module.
"""

import contextlib
import time
import types

import torchtitan.trainer as titan_trainer


@contextlib.contextmanager
def skipped():
    real = titan_trainer.time
    names = {name: getattr(time, name) for name in dir(time) if not name.startswith("_")}
    titan_trainer.time = types.SimpleNamespace(**{**names, "sleep": lambda seconds: None})
    try:
        yield
    finally:
        titan_trainer.time = real
