"""How often a gloo worker aborts as it exits without destroying its process group, and with teardown.py.

    PYTHONPATH=recipes:. .venv/bin/python -m bench.bench_exit --runs 20    # about 3 minutes on 2 cores

Each run is one torchrun of 2 gloo ranks that do a few collectives on the world and on a side group (as the trainer
and its save-on-stop group do), then end by SystemExit(3), as a stop or a diverged loss ends a worker. Alternating
in one run: stock (the groups left to interpreter finalization) and with `teardown.at_exit()`. An abort is torchrun
reporting SIGABRT for a rank instead of its exit 3.
"""

import argparse
import os
import subprocess
import sys
import tempfile

WORKER = """
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if sys.argv[1] == "teardown":
    from neuron_qwen3.run import teardown
    teardown.at_exit()
side = dist.new_group(backend="gloo", timeout=timedelta(seconds=60))
for _ in range(3):
    dist.all_reduce(torch.ones(1000))
    dist.all_reduce(torch.tensor([dist.get_rank()]), op=dist.ReduceOp.MAX, group=side)
dist.all_gather([torch.empty(1) for _ in range(dist.get_world_size())], torch.tensor([1.0]))
raise SystemExit(3)
"""


def aborted(script: str, mode: str) -> bool:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            "127.0.0.1:0",
            script,
            mode,
        ],
        capture_output=True,
        text=True,
    )
    output = result.stdout + result.stderr
    assert "exitcode  : 3" in output or "SIGABRT" in output, output[-2000:]
    return "SIGABRT" in output


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20, help="launches of each kind")
    runs = parser.parse_args().runs
    counts = {"stock": 0, "teardown": 0}
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        for _ in range(runs):
            for mode in counts:
                counts[mode] += aborted(script, mode)
    for mode, count in counts.items():
        print(f"{mode:<9} {count} of {runs} launches aborted at exit (SIGABRT)")


if __name__ == "__main__":
    main()
