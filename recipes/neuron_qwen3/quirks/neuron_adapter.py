"""Lets torchtitan 0.3.0 train on TorchNeuron's `neuron` device where it assumes CUDA's process group.

torchtitan initialises the process group with the device's backend alone (`torchtitan/distributed/utils.py`,
`init_distributed`: "cpu:gloo" is added only with `training.enable_cpu_offload`). NCCL's group also answers the
host tensors of torch's object collectives, which DCP's checkpoint save uses to agree on its plan; TorchNeuron's
`neuron` backend is registered for the `neuron` device only, so a save stops with "No backend type associated with
device type cpu". On Neuron the group is therefore "neuron:neuron,cpu:gloo": gloo takes the host tensors.
tests/test_neuron_sim_training.py has the test that fails when this is removed.
"""

import functools

from neuron_qwen3.quirks.devices import rebind


def _with_host_backend(init_distributed):
    @functools.wraps(init_distributed)
    def with_host_backend(comm_config, enable_cpu_backend: bool = False, **kwargs):
        return init_distributed(comm_config, enable_cpu_backend=True, **kwargs)

    return with_host_backend


def activate() -> None:
    """Apply the Neuron patches (devices.set_up, on a neuron device). Idempotent."""
    import torchtitan.distributed.utils as tt_dist

    if not getattr(tt_dist.init_distributed, "__wrapped__", None):
        rebind(tt_dist, "init_distributed", _with_host_backend(tt_dist.init_distributed))
