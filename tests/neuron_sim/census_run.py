"""The article's command on the simulated device, with the census split by phase: a torchrun worker script.

    torchrun ... tests/neuron_sim/census_run.py CENSUS.json --module neuron_qwen3 --config ... --device neuron

It is `python -m torchtitan.train` (its `main`, the same arguments) after five methods are wrapped to mark their
phase for the recorder (recorder.Phases): torchtitan's training step, its validation, its checkpoint save, the
project's samples and its Hugging Face export. Rank 0 writes the census to CENSUS.json at exit. The wrapping only
records: the run is the stock one.
"""

import atexit
import os
import sys

import neuron_sim  # loaded under this name at start-up by site/sitecustomize.py (NEURON_SIM=1)

assert neuron_sim.installed(), "run with NEURON_SIM=1 and tests/neuron_sim/site on PYTHONPATH"

from neuron_sim.recorder import Phases  # noqa: E402
from torchtitan import train  # noqa: E402
from torchtitan.components.checkpointer import BaseCheckpointManager  # noqa: E402
from torchtitan.components.validate import Validator  # noqa: E402
from torchtitan.trainer import Trainer  # noqa: E402

from neuron_qwen3.hf import weights  # noqa: E402
from neuron_qwen3.report.samples import Sampler  # noqa: E402

census = sys.argv.pop(1)
phases = Phases()
phases.wrap(Trainer, "train_step", "training step")
phases.wrap(Validator, "validate", "validation")
phases.wrap(BaseCheckpointManager, "save", "checkpoint save")
phases.wrap(Sampler, "sample", "sample")
phases.wrap(weights, "export", "export")
if os.environ.get("RANK", "0") == "0":
    atexit.register(phases.dump, census)
train.main()
