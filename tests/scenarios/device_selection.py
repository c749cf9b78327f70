"""Which device torchtitan picks on this host; prints it.

argv[1]: "patched" applies the CPU adapter, "upstream" does not. Either way torchtitan's trainer is imported first,
as stock `python -m torchtitan.train` does: the adapter must rebind what its modules copied at import.
"""

import os
import sys

import torchtitan.distributed.utils as tt_distributed_utils
import torchtitan.trainer  # noqa: F401

if sys.argv[1] == "patched":
    from neuron_qwen3.quirks import cpu_adapter

    cpu_adapter.activate()
from torchtitan.components.metrics import build_device_memory_monitor
from torchtitan.tools.utils import device_type, get_local_device

os.environ.setdefault("LOCAL_RANK", "0")
print(f"device_type={device_type} copied={tt_distributed_utils.device_type} local_device={get_local_device()}")
monitor = build_device_memory_monitor()
print(f"peak_gib={monitor.get_peak_stats().max_reserved_gib:.3f}")
