"""A torchrun worker for the tests: the `neuron` process group on neuron tensors, each collective checked.

Run with NEURON_SIM=1 and tests/neuron_sim/site on PYTHONPATH (the sim is then loaded at start-up, as a
training worker would have it). Prints one JSON line per rank: what torchtitan would pick, each collective's
result, and what the process group recorded.
"""

import json
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def main() -> None:
    import neuron_sim  # loaded by sitecustomize under this name

    from neuron_sim import process_group

    assert neuron_sim.installed(), "NEURON_SIM=1 and tests/neuron_sim/site on PYTHONPATH"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    torch.neuron.set_device(device)
    backend = dist.Backend.default_device_backend_map.get("neuron")
    dist.init_process_group(backend=backend)
    group = dist.group.WORLD

    summed = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(summed)
    averaged = torch.full((2,), float(rank + 1), device=device, dtype=torch.bfloat16)
    dist.all_reduce(averaged, op=dist.ReduceOp.AVG)
    gathered = torch.empty(2 * world, device=device)
    dist.all_gather_single(gathered, torch.full((2,), float(rank), device=device))
    scattered = torch.empty(2, device=device)
    dist.reduce_scatter_single(scattered, torch.arange(2.0 * world, device=device))
    premultiplied = torch.empty(2, device=device)  # FSDP2's gradient reduce-scatter: each input scaled, then summed
    dist.reduce_scatter_single(premultiplied, torch.arange(2.0 * world, device=device), dist._make_nccl_premul_sum(0.5))
    sent = torch.full((3,), float(rank), device=device)
    dist.broadcast(sent, src=world - 1)
    dist.barrier()
    functional = funcol.all_reduce(torch.ones(3, device=device), "sum", group)
    functional = funcol.wait_tensor(functional)

    result = json.dumps(
        {
            "rank": rank,
            "backend": backend,
            "backend_name": group._get_backend_name(),
            "group_name": group.group_name,
            "devices": sorted(
                {t.device.type for t in (summed, averaged, gathered, scattered, premultiplied, sent, functional)}
            ),
            "all_reduce": summed.cpu().tolist(),
            "avg_bf16": averaged.float().cpu().tolist(),
            "all_gather": gathered.cpu().tolist(),
            "reduce_scatter": scattered.cpu().tolist(),
            "premul_sum": premultiplied.cpu().tolist(),
            "broadcast": sent.cpu().tolist(),
            "functional": functional.cpu().tolist(),
            "collectives": [list(c) for c in process_group.COLLECTIVES],
        }
    )
    os.write(1, f"RESULT {result}\n".encode())  # one write: both ranks share the pipe, and print writes twice
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
