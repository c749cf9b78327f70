"""INIT_FROM load and EXPORT_DIR export on CPU over FSDP ranks (gloo), beside a plain write and read of the same bytes.

    PYTHONPATH=recipes:. .venv/bin/python -m bench.bench_weights            # 3 sizes on 1 and 2 ranks (~12 GB)
    PYTHONPATH=recipes:. .venv/bin/python -m bench.bench_weights --sizes 1b --nproc 2 --max-shard-mb 500
    PYTHONPATH=recipes:. .venv/bin/python -m bench.bench_weights --sizes smoke --nproc 1    # seconds
    PYTHONPATH=recipes:. .venv/bin/python -m bench.bench_weights --sizes 0.6b --new-only --cold  # reads from disk

Each size and rank count is one torchrun of this file's worker: a random Qwen3 (SIZES) built on meta, every layer and
the root sharded with FSDP2 (fp32 parameters, as a trainer holds them), then, alternating in one run so load from
other processes hits every row alike:
- plain write: rank 0 writes the export's bytes to one file in 64 MiB blocks;
- export: `neuron_qwen3.weights.export` (streamed, sharded.py: every rank writes its own rows), and the export
  before issue 22 (`old_export`: every tensor gathered in fp32 to rank 0, converted and cast whole,
  huggingface_hub's save_torch_state_dict), each timed from a barrier to a barrier;
- plain read: rank 0 reads the export's files in 64 MiB reads; the page cache is warm, so reads measure memory
  and parsing, not the disk, unless `--cold` drops the files from it before each plain read and each load (a
  fine-tune reads INIT_FROM once, from the disk);
- INIT_FROM load: `neuron_qwen3.hf_load.load` (every rank copies its own rows from the memory-mapped files), and
  torchtitan 0.3.0's HF initial load (`torchtitan load`), as DCPCheckpointer.dcp_load(from_hf=True) does it on
  every rank: to_hf of the sharded state dict, dcp.load with the adapter's HuggingFaceStorageReader, from_hf.
Memory: each rank's resident set before an export and its peak during it (the kernel's high-water mark, reset
first through /proc/self/clear_refs); the workers run with MALLOC_MMAP_THRESHOLD_=1 MiB, so glibc returns every
freed tensor to the kernel and the resident set is what is live, not what malloc kept. The loaded weights are
checked against the exported ones (a hash of each rank's shards). Medians of --repeats, and the range of the
ratios of each repeat's pair (the disk's speed moves from one repeat to the next); GB/s = bytes of safetensors /
seconds.
"""

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torchtitan.components.checkpoint import ModelWrapper
from torchtitan.models.qwen3 import model_registry

from neuron_qwen3 import config_registry, hf_load, shapes, weights

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
CHUNK = 64 << 20
SIZES = {  # name: (shape, what it is)
    "smoke": (shapes.SMOKE, "the smoke shape"),
    "0.6b": (shapes.FLAVORS["0.6B"], "Qwen3-0.6B"),
    "1b": (dataclasses.replace(shapes.FLAVORS["1.7B"], n_layers=16), "Qwen3-1.7B's width, 16 of its 28 layers"),
    "a3b-2l": (dataclasses.replace(shapes.FLAVORS["30B-A3B"], n_layers=2, num_experts=8, top_k=2),
               "Qwen3-30B-A3B's width, 2 layers of 8 experts"),
}


def sharded_trainer(shape: shapes.Shape, dtype: str, max_shard_mb: int) -> types.SimpleNamespace:
    """What the export and the load read of a Trainer, over FSDP2 as the trainer shards it (layers, then root);
    built by the smoke configs' own Qwen3 builder (dense: tied embeddings; MoE: untied, as the real ones)."""
    config = config_registry.native_qwen3_smoke()
    base = model_registry("debugmodel_moe" if shape.num_experts else "debugmodel")
    config.model_spec = dataclasses.replace(base, model=config_registry._small_qwen3(shape))
    config.checkpoint.initial_load_in_hf = True
    config.export.dtype, config.export.max_shard_mb = dtype, max_shard_mb
    weights.hf_compatible(config)  # no MoE routing bias: Hugging Face's Qwen3-MoE has none
    with torch.device("meta"):
        model = config.model_spec.model.build()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fsdp",))  # named, as torchtitan's
    for layer in model.layers.values():
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)  # as the trainer does after to_empty (it re-ties lm_head)
    return types.SimpleNamespace(config=config, model_parts=[model], model_config=config.model_spec.model)


def export(trainer, target: str) -> None:
    """`--export.dir target`: the project's export, as the trainer calls it."""
    trainer.config.export.dir = target
    weights.export(trainer)


def old_export(trainer, target: str, dtype) -> None:
    """The export before issue 22 (weights.py at e2806db), weights only: kept here to measure against."""
    from huggingface_hub import save_torch_state_dict

    keep = dist.get_rank() == 0
    states = {}
    for key, value in ModelWrapper(trainer.model_parts).state_dict().items():
        full = value.full_tensor() if isinstance(value, DTensor) else value
        if keep:
            states[key] = full.detach().to("cpu")
    if keep:
        tensors = {key: own_storage(value.to(dtype) if value.is_floating_point() else value)
                   for key, value in weights._adapter(trainer).to_hf(states).items()}
        staging = f"{target}.partial"
        os.makedirs(staging)
        save_torch_state_dict(tensors, staging, max_shard_size="5GB")
        os.rename(staging, target)
    dist.barrier()


def own_storage(tensor):
    """The old export's copy of each expert slice: safetensors refuses tensors that share storage."""
    tensor = tensor.contiguous()
    return tensor.clone() if tensor.untyped_storage().nbytes() != tensor.nbytes else tensor


def own_load(trainer, folder: str) -> None:
    adapter = trainer.config.model_spec.state_dict_adapter(trainer.model_config, None)
    assert hf_load.load(trainer.model_parts, adapter, folder)


def torchtitan_load(trainer, folder: str) -> None:
    """torchtitan's DCPCheckpointer.dcp_load(from_hf=True)."""
    wrapper = ModelWrapper(trainer.model_parts)
    adapter = trainer.config.model_spec.state_dict_adapter(trainer.model_config, None)
    hf_state_dict = adapter.to_hf(wrapper.state_dict())
    dcp.load(hf_state_dict, storage_reader=adapter.get_hf_storage_reader(folder))
    wrapper.load_state_dict(adapter.from_hf(hf_state_dict))


def shard_hashes(trainer, dtype) -> dict:
    """A hash of this rank's part of each tensor, in the export dtype."""
    hashes = {}
    for key, value in trainer.model_parts[0].state_dict().items():
        local = (value.to_local() if isinstance(value, DTensor) else value).detach().to(dtype).contiguous()
        hashes[key] = hashlib.sha1(local.view(torch.uint8).numpy()).hexdigest()
    return hashes


def memory_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M)[1])


def disk_read_bytes() -> int:
    """Bytes this process has had read from storage (page cache misses, by read() or by page faults of a map)."""
    with open("/proc/self/io") as f:
        return int(re.search(r"^read_bytes: (\d+)", f.read(), re.M)[1])


def measured(fn, *args) -> dict:
    """Seconds from a barrier to a barrier, this rank's resident set before and peak during `fn`, and the bytes
    it read from the disk."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set
    dist.barrier()
    before, read, start = memory_kib("VmRSS"), disk_read_bytes(), time.perf_counter()
    fn(*args)
    dist.barrier()
    return {"s": time.perf_counter() - start, "rss": before << 10, "peak": memory_kib("VmHWM") << 10,
            "disk": disk_read_bytes() - read}


def plain_write(target: str, size: int, block: bytes) -> None:
    if dist.get_rank() == 0:
        with open(target, "wb") as f:
            for offset in range(0, size, CHUNK):
                f.write(block[: min(CHUNK, size - offset)])


def evict(folder: str) -> None:
    """Drop the folder's safetensors from the page cache (written back first: only clean pages can be dropped)."""
    if dist.get_rank() == 0:
        for name in os.listdir(folder):
            if name.endswith(".safetensors"):
                fd = os.open(os.path.join(folder, name), os.O_RDONLY)
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
    dist.barrier()


def plain_read(folder: str, buffer: bytearray) -> None:
    if dist.get_rank() == 0:
        for name in sorted(os.listdir(folder)):
            if name.endswith(".safetensors"):
                with open(os.path.join(folder, name), "rb", buffering=0) as f:
                    while f.readinto(buffer):
                        pass


def worker(args) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shape, label = SIZES[args.size]
    dtype = getattr(torch, args.dtype)
    trainer = sharded_trainer(shape, args.dtype, args.max_shard_mb)
    parameters = sum(p.numel() for p in trainer.model_parts[0].parameters())
    before = shard_hashes(trainer, dtype)
    root = args.dir
    source, new, old = (os.path.join(root, name) for name in ("source", "new", "old"))
    export(trainer, source)  # the folder the loads and plain reads read
    shards = [os.path.getsize(os.path.join(source, n)) for n in os.listdir(source) if n.endswith(".safetensors")]
    size, files, largest = sum(shards), len(shards), max(shards)
    buffer, block = bytearray(CHUNK), os.urandom(1 << 20) * (CHUNK >> 20)
    rows = {"plain write": [], "export": [], "old export": [], "plain read": [], "INIT_FROM load": [],
            "torchtitan load": []}
    for _ in range(args.repeats):
        rows["plain write"].append(measured(plain_write, os.path.join(root, "plain.bin"), size, block))
        if rank == 0:
            os.remove(os.path.join(root, "plain.bin"))
        rows["export"].append(measured(export, trainer, new))
        if not args.new_only:
            rows["old export"].append(measured(old_export, trainer, old, dtype))
            if rank == 0:
                shutil.rmtree(old)
        if args.cold:
            evict(source)
        rows["plain read"].append(measured(plain_read, source, buffer))
        for name, load in (("INIT_FROM load", own_load), ("torchtitan load", torchtitan_load)):
            with torch.no_grad():
                trainer.model_parts[0].init_weights(buffer_device=None)  # new random weights: the load brings them
            if args.cold:
                evict(source)
            rows[name].append(measured(load, trainer, source))
            assert shard_hashes(trainer, dtype) == before, f"{name}: the loaded weights are not the exported ones"
    everyone = [None] * world
    dist.all_gather_object(everyone, rows)
    if rank == 0:
        report(args, label, parameters, size, files, largest, world, everyone)
    dist.destroy_process_group()


def report(args, label, parameters, size, files, largest, world, everyone) -> None:
    median = {name: statistics.median(r["s"] for r in runs) for name, runs in everyone[0].items() if runs}
    print(f"{args.size} ({label}): {parameters / 1e9:.3f} B parameters, {size / 1e6:.0f} MB of {args.dtype} "
          f"safetensors in {files} file(s) (largest {largest / 1e6:.0f} MB; limit {args.max_shard_mb} MB), "
          f"{world} rank(s), page cache {'dropped before each read' if args.cold else 'warm'}")
    base = {"export": "plain write", "old export": "plain write", "INIT_FROM load": "plain read",
            "torchtitan load": "plain read"}
    for name, seconds in median.items():
        ratio = ""
        if name in base:  # each repeat's pair too: the disk's speed moves from one repeat to the next
            paired = sorted(b["s"] / r["s"] for b, r in zip(everyone[0][base[name]], everyone[0][name]))
            ratio = (f"  {median[base[name]] / seconds:5.2f}x {base[name]} "
                     f"(each repeat: {paired[0]:.2f}-{paired[-1]:.2f}x)")
        print(f"  {name:<15} {seconds:7.3f} s {size / seconds / 1e9:7.3f} GB/s{ratio}")
    for name in ("export", "old export", "INIT_FROM load", "torchtitan load"):
        if not everyone[0][name]:
            continue
        ranks = []
        for rank, rows in enumerate(everyone):
            rss = max(r["rss"] for r in rows[name])
            extra = max(r["peak"] - r["rss"] for r in rows[name])
            ranks.append(f"rank {rank} {rss / 1e6:.0f} + {extra / 1e6:.0f} MB")
        print(f"  {name + ' memory':<22} resident before + peak extra during: {'; '.join(ranks)}")
    if args.cold:
        for name in ("plain read", "INIT_FROM load", "torchtitan load"):
            read = [max(r["disk"] for r in rows[name]) / 1e6 for rows in everyone]
            print(f"  {name + ' disk':<22} MB read from the disk, per rank: {', '.join(f'{mb:.0f}' for mb in read)}")
    peaks = {name: [max(r["peak"] - r["rss"] for r in rows[name]) for rows in everyone] for name in median}
    print(json.dumps({"size": args.size, "ranks": world, "bytes": size, "files": files, "largest": largest,
                      "median_s": median, "peak_extra_bytes": peaks}))


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--sizes", nargs="+", default=["0.6b", "1b", "a3b-2l"], choices=list(SIZES))
    cli.add_argument("--nproc", nargs="+", type=int, default=[1, 2])
    cli.add_argument("--repeats", type=int, default=3)
    cli.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    cli.add_argument("--max-shard-mb", type=int, default=5000, help="--export.max_shard_mb (default 5000: 5GB)")
    cli.add_argument("--new-only", action="store_true", help="leave out the old export (it holds the model twice)")
    cli.add_argument("--cold", action="store_true", help="read and load from the disk, not the page cache")
    cli.add_argument("--dir", default=None, help="where the safetensors go (default: a temporary folder)")
    cli.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    cli.add_argument("--size", help=argparse.SUPPRESS)
    args = cli.parse_args()
    if args.worker:
        return worker(args)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (os.path.join(REPO, "recipes"), REPO,
                                                                      os.environ.get("PYTHONPATH")))),
           "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}  # freed tensors go back to the kernel: RSS is what is live
    for size in args.sizes:
        for nproc in args.nproc:
            with tempfile.TemporaryDirectory(dir=args.dir) as root:
                env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
                subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                                "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", "--local-ranks-filter",
                                "0", "-m", "bench.bench_weights", "--worker", "--size", size, "--dir", root,
                                "--repeats", str(args.repeats), "--dtype", args.dtype, "--max-shard-mb",
                                str(args.max_shard_mb), *(["--new-only"] if args.new_only else []),
                                *(["--cold"] if args.cold else [])],
                               env=env, cwd=REPO, check=True)


if __name__ == "__main__":
    main()
