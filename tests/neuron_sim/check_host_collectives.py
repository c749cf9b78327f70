"""A torchrun worker for the tests: torchtitan's process group on the simulated device, and a host-tensor collective.

    check_host_collectives.py upstream|patched

torchtitan's `init_distributed` as it is (upstream), or after the project's Neuron adapter (patched,
quirks/neuron_adapter.py), then a host tensor's all-reduce and the object collective DCP's checkpoint save makes.
Prints one JSON line per rank: the group's devices and the results, or the first error.
"""

import json
import os
import sys

import torch
import torch.distributed as dist


def main(mode: str) -> None:
    import neuron_sim  # loaded by sitecustomize under this name

    assert neuron_sim.installed(), "NEURON_SIM=1 and tests/neuron_sim/site on PYTHONPATH"
    torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
    import torchtitan.distributed.utils as tt_dist
    from torchtitan.config.configs import CommConfig

    if mode == "patched":
        from neuron_qwen3.quirks import neuron_adapter

        neuron_adapter.activate()
    tt_dist.init_distributed(CommConfig())
    result = {"rank": dist.get_rank(), "devices": sorted(d.type for d in dist.group.WORLD._device_types)}
    try:
        host = torch.ones(2)
        dist.all_reduce(host)
        result["host_all_reduce"] = host.tolist()
        gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object({"rank": dist.get_rank()}, gathered)  # as DCP's save plans
        result["gathered"] = gathered
    except RuntimeError as error:
        result["error"] = str(error).splitlines()[0]
    os.write(1, f"RESULT {json.dumps(result)}\n".encode())  # one write: both ranks share the pipe
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
