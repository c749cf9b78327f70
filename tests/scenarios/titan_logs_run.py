"""A training worker as `torchrun ... -m torchtitan.train` runs it, with quirks/titan_logs.py installed where the
project installs it; run under torchrun.

argv: torchtitan's arguments (`--module neuron_qwen3 --config ...`). The filter goes on before the config is parsed
(as config_registry's import puts it there) and is armed for the peak lines at the start of the project's trainer
(RunHooks.__init__, before torchtitan's Trainer.__init__). Both calls are idempotent, so this still holds once the
project makes them itself. After training, one line: `titan_logs corrected: {json}`, the filter's count of each
torchtitan line it dropped or replaced in this run, i.e. what stock torchtitan would have printed.
"""

import json
import sys

from neuron_qwen3 import trainer as project_trainer
from neuron_qwen3.quirks import titan_logs

titan_logs.install()  # as config_registry's import does: before any config function builds a checkpoint Config
built = project_trainer.RunHooks.__init__


def __init__(self, config):
    titan_logs.install(project_mfu=True)  # as RunHooks.__init__ does, before torchtitan's Trainer.__init__
    built(self, config)


project_trainer.RunHooks.__init__ = __init__

from torchtitan.train import main  # noqa: E402

sys.argv = ["torchtitan.train", *sys.argv[1:]]
main()
print(f"titan_logs corrected: {json.dumps(dict(titan_logs.install().corrected), sort_keys=True)}", flush=True)
