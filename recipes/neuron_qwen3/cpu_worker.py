"""The CPU worker: the CPU adapter first (before torchtitan is imported), then the project's trainer main.

The launcher runs this worker on CPU hosts (neuron_qwen3.trainer on CUDA). Also usable by hand without
torchrun, as a single process:
    PYTHONPATH=recipes python -m neuron_qwen3.cpu_worker --module neuron_qwen3 --config native_qwen3_smoke
"""

import os
import socket

from neuron_qwen3 import cpu_adapter


def _single_process_defaults() -> None:
    """torch.distributed needs these; torchrun sets them, a bare `python -m` does not."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        os.environ.setdefault(key, value)


def main() -> None:
    if cpu_adapter.needed():
        cpu_adapter.activate()
    _single_process_defaults()
    from neuron_qwen3 import trainer

    trainer.main()


if __name__ == "__main__":
    main()
