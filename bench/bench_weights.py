"""INIT_FROM load and EXPORT_DIR export on CPU over FSDP ranks (gloo), beside a plain write and read of the same bytes.

    PYTHONPATH=recipes:. .venv/bin/python -m bench.bench_weights            # 3 sizes on 1 and 2 ranks (~12 GB)
    PYTHONPATH=recipes:. .venv/bin/python -m bench.bench_weights --sizes 1b --nproc 2 --max-shard-mb 500
    PYTHONPATH=recipes:. .venv/bin/python -m bench.bench_weights --sizes smoke --nproc 1    # seconds
    PYTHONPATH=recipes:. .venv/bin/python -m bench.bench_weights --sizes 0.6b --new-only --cold  # reads from disk

Each size and rank count is one torchrun of this file's worker: a random Qwen3 (SIZES) built on meta, every layer and
the root sharded with FSDP2 (fp32 parameters, as a trainer holds them), exported once into the folder the reads
read. Then --repeats times, each side timed from a barrier to a barrier:
- writes: plain write (rank 0 writes as many bytes as the export's safetensors to a new file in 64 MiB blocks and
  fsyncs it before closing); export (`neuron_qwen3.hf.weights.export` into a new folder, every rank writing its own
  rows, then rank 0 fsyncs every file of the folder); unless --new-only, old export (the export before the streamed
  one: the model gathered in fp32 to rank 0, huggingface_hub's save_torch_state_dict, fsynced likewise). Each
  output is deleted after it is timed, outside the timing.
- reads: plain read (rank 0 reads the folder's safetensors in 64 MiB reads); INIT_FROM load
  (`neuron_qwen3.hf.load.load`: every rank copies its own rows from the memory-mapped files); torchtitan load
  (torchtitan 0.3.0's DCPCheckpointer.dcp_load(from_hf=True) path). Each load starts from new random weights and
  must end with each rank's shards hashing as exported.
Order: even repeats run each group in the order listed, odd repeats in reverse, so in every pair (export or old
export / plain write, each load / plain read) each side goes first in half the repeats.
Cache: with --cold, before each plain read and each load, rank 0 runs `sync; echo 3 > /proc/sys/vm/drop_caches`
(the whole page cache) if it can write that file, else fsyncs and posix_fadvise(DONTNEED)s each safetensors file;
the output names the method. Without --cold the reads hit the page cache.
Reported per run: each side's median seconds and GB/s (bytes of safetensors / seconds); per pair the median and the
min-max of each repeat's own ratio (baseline seconds / side seconds: > 1 is faster than the plain side), against the
goals export >= 0.8x, INIT_FROM load >= 0.9x (median); each rank's resident set before and peak extra during an
export or load (VmHWM reset through /proc/self/clear_refs; MALLOC_MMAP_THRESHOLD_=1 MiB returns freed tensors to
the kernel); with --cold the MB each rank read from the disk (/proc/self/io). Last, one table of every run.
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

from neuron_qwen3 import config_registry, shapes
from neuron_qwen3.hf import load, weights

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
CHUNK = 64 << 20
DROP_CACHES = "/proc/sys/vm/drop_caches"
CACHE_METHODS = {
    "drop_caches": "`sync; echo 3 > /proc/sys/vm/drop_caches`, the whole page cache",
    "fadvise": "/proc/sys/vm/drop_caches not writable: each safetensors file fsynced and posix_fadvise(DONTNEED)",
    "warm": "warm, not dropped",
}
BASE = {
    "export": "plain write",
    "old export": "plain write",
    "INIT_FROM load": "plain read",
    "torchtitan load": "plain read",
}  # each side's plain baseline
GOALS = {"export": 0.8, "INIT_FROM load": 0.9}  # the project's goals; the others are references
SIZES = {  # name: (shape, what it is)
    "smoke": (shapes.SMOKE, "the smoke shape"),
    "0.6b": (shapes.FLAVORS["0.6B"], "Qwen3-0.6B"),
    "1b": (dataclasses.replace(shapes.FLAVORS["1.7B"], n_layers=16), "Qwen3-1.7B's width, 16 of its 28 layers"),
    "a3b-2l": (
        dataclasses.replace(shapes.FLAVORS["30B-A3B"], n_layers=2, num_experts=8, top_k=2),
        "Qwen3-30B-A3B's width, 2 layers of 8 experts",
    ),
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


def fsync_files(folder: str) -> None:
    """fsync every file of `folder` (an fsync writes back the file's dirty pages, whichever rank wrote them)."""
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def synced_export(trainer, target: str) -> None:
    """The export, then rank 0 fsyncs every file of the folder: every rank has written its part once it returns."""
    export(trainer, target)
    if dist.get_rank() == 0:
        fsync_files(target)


def old_export(trainer, target: str, dtype) -> None:
    """The export before the streamed one (weights.py at e2806db), weights only, then rank 0 fsyncs its files:
    kept here to measure against."""
    from huggingface_hub import save_torch_state_dict

    keep = dist.get_rank() == 0
    states = {}
    for key, value in ModelWrapper(trainer.model_parts).state_dict().items():
        full = value.full_tensor() if isinstance(value, DTensor) else value
        if keep:
            states[key] = full.detach().to("cpu")
    if keep:
        tensors = {
            key: own_storage(value.to(dtype) if value.is_floating_point() else value)
            for key, value in weights._adapter(trainer).to_hf(states).items()
        }
        staging = f"{target}.partial"
        os.makedirs(staging)
        save_torch_state_dict(tensors, staging, max_shard_size="5GB")
        os.rename(staging, target)
        fsync_files(target)
    dist.barrier()


def own_storage(tensor):
    """The old export's copy of each expert slice: safetensors refuses tensors that share storage."""
    tensor = tensor.contiguous()
    return tensor.clone() if tensor.untyped_storage().nbytes() != tensor.nbytes else tensor


def own_load(trainer, folder: str) -> None:
    adapter = trainer.config.model_spec.state_dict_adapter(trainer.model_config, None)
    assert load.load(trainer.model_parts, adapter, folder)


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
    return {
        "s": time.perf_counter() - start,
        "rss": before << 10,
        "peak": memory_kib("VmHWM") << 10,
        "disk": disk_read_bytes() - read,
    }


def plain_write(target: str, size: int, block: bytes) -> None:
    """Rank 0 writes `size` bytes to `target` in 64 MiB blocks and fsyncs it before closing."""
    if dist.get_rank() == 0:
        with open(target, "wb", buffering=0) as f:
            for offset in range(0, size, CHUNK):
                data = block[: min(CHUNK, size - offset)]
                assert f.write(data) == len(data)  # unbuffered: one write() call each
            os.fsync(f.fileno())


def drop_caches_method() -> str:
    """How this machine's page cache can be dropped, tried once: "drop_caches" (`sync; echo 3 >
    /proc/sys/vm/drop_caches`: the whole page cache; root, with /proc/sys writable), else "fadvise"."""
    try:
        os.sync()
        with open(DROP_CACHES, "w") as f:
            f.write("3")
        return "drop_caches"
    except OSError:
        return "fadvise"


def drop_cache(folder: str, method: str) -> None:
    """Rank 0 drops the folder's safetensors from the page cache: the whole cache through drop_caches, or each
    file written back and posix_fadvise(DONTNEED) (only clean pages can be dropped). Mapped pages stay either way."""
    if dist.get_rank() == 0:
        if method == "drop_caches":
            os.sync()
            with open(DROP_CACHES, "w") as f:
                f.write("3")
        else:
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


def remove(path: str) -> None:
    if dist.get_rank() == 0:
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def in_order(sides: list, repeat: int) -> list:
    """Even repeats in the listed order, odd ones reversed: in every pair each side goes first in half the repeats."""
    return sides if repeat % 2 == 0 else sides[::-1]


def worker(args) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shape, label = SIZES[args.size]
    dtype = getattr(torch, args.dtype)
    trainer = sharded_trainer(shape, args.dtype, args.max_shard_mb)
    parameters = sum(p.numel() for p in trainer.model_parts[0].parameters())
    before = shard_hashes(trainer, dtype)
    root = args.dir
    source, new, old, plain = (os.path.join(root, name) for name in ("source", "new", "old", "plain.bin"))
    export(trainer, source)  # the folder the loads and plain reads read
    shards = [os.path.getsize(os.path.join(source, n)) for n in os.listdir(source) if n.endswith(".safetensors")]
    size, files, largest = sum(shards), len(shards), max(shards)
    buffer, block = bytearray(CHUNK), os.urandom(1 << 20) * (CHUNK >> 20)
    method = [drop_caches_method() if rank == 0 and args.cold else None]
    dist.broadcast_object_list(method, src=0)
    method = method[0]
    writes = {"plain write": (plain_write, (plain, size, block), plain), "export": (synced_export, (trainer, new), new)}
    if not args.new_only:
        writes["old export"] = (old_export, (trainer, old, dtype), old)
    reads = {
        "plain read": (plain_read, (source, buffer)),
        "INIT_FROM load": (own_load, (trainer, source)),
        "torchtitan load": (torchtitan_load, (trainer, source)),
    }
    rows = {name: [] for name in (*writes, *reads)}
    for repeat in range(args.repeats):
        for name in in_order(list(writes), repeat):
            fn, fn_args, output = writes[name]
            rows[name].append(measured(fn, *fn_args))
            remove(output)  # each side writes a new file or folder
        for name in in_order(list(reads), repeat):
            fn, fn_args = reads[name]
            if name != "plain read":
                with torch.no_grad():
                    trainer.model_parts[0].init_weights(buffer_device=None)  # new random weights: the load brings them
            if args.cold:
                drop_cache(source, method)
            rows[name].append(measured(fn, *fn_args))
            if name != "plain read":
                assert shard_hashes(trainer, dtype) == before, f"{name}: the loaded weights are not the exported ones"
    everyone = [None] * world
    dist.all_gather_object(everyone, rows)
    if rank == 0:
        result = report(args, label, parameters, size, files, largest, world, everyone, method)
        with open(os.path.join(root, "result.json"), "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


def spread(ratios: list) -> dict:
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def ratio_rows(rows: dict) -> dict:
    """Each side against its plain baseline: the median, min and max of each repeat's own ratio (the baseline's
    seconds / the side's, so > 1 is faster than the baseline)."""
    found = {}
    for name, base in BASE.items():
        if rows.get(name):
            found[name] = spread([b["s"] / r["s"] for b, r in zip(rows[base], rows[name], strict=True)])
    return found


def verdict(name: str, ratio: dict) -> str:
    goal = GOALS.get(name)
    if goal is None:
        return "reference"
    return f">= {goal}x: {'met' if ratio['median'] >= goal else 'missed'}"


def report(args, label, parameters, size, files, largest, world, everyone, method) -> dict:
    rows = everyone[0]
    median = {name: statistics.median(r["s"] for r in runs) for name, runs in rows.items() if runs}
    cache = f"dropped before each read and load ({CACHE_METHODS[method]})" if args.cold else "warm"
    print(
        f"{args.size} ({label}): {parameters / 1e9:.3f} B parameters, {size / 1e6:.0f} MB of {args.dtype} "
        f"safetensors in {files} file(s) (largest {largest / 1e6:.0f} MB; limit {args.max_shard_mb} MB), "
        f"{world} rank(s), {args.repeats} repeats, page cache {cache}"
    )
    ratios = ratio_rows(rows)
    print(
        f"  {'side':<16} {'baseline':<12} {'side s':>8} {'base s':>8} {'side GB/s':>9}  "
        f"{'ratio: median (range of repeats)':<34} goal"
    )
    for name, ratio in ratios.items():
        base = BASE[name]
        print(
            f"  {name:<16} {base:<12} {median[name]:8.3f} {median[base]:8.3f} {size / median[name] / 1e9:9.3f}  "
            f"{ratio['median']:5.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f}x){'':<18} {verdict(name, ratio)}"
        )
    for name in ("export", "old export", "INIT_FROM load", "torchtitan load"):
        if not rows.get(name):
            continue
        ranks = []
        for rank, each in enumerate(everyone):
            rss = max(r["rss"] for r in each[name])
            extra = max(r["peak"] - r["rss"] for r in each[name])
            ranks.append(f"rank {rank} {rss / 1e6:.0f} + {extra / 1e6:.0f} MB")
        print(f"  {name + ' memory':<22} resident before + peak extra during: {'; '.join(ranks)}")
    if args.cold:
        for name in reads_of(rows):
            read = [max(r["disk"] for r in each[name]) / 1e6 for each in everyone]
            print(f"  {name + ' disk':<22} MB read from the disk, per rank: {', '.join(f'{mb:.0f}' for mb in read)}")
    peaks = {name: [max(r["peak"] - r["rss"] for r in each[name]) for each in everyone] for name in median}
    result = {
        "size": args.size,
        "label": label,
        "ranks": world,
        "bytes": size,
        "files": files,
        "largest": largest,
        "repeats": args.repeats,
        "cache": method if args.cold else "warm",
        "median_s": median,
        "seconds": {name: [r["s"] for r in runs] for name, runs in rows.items()},
        "ratios": ratios,
        "peak_extra_bytes": peaks,
    }
    print(json.dumps(result))
    return result


def reads_of(rows: dict) -> list:
    return [name for name in ("plain read", "INIT_FROM load", "torchtitan load") if rows.get(name)]


def summary(results: list) -> None:
    """One table of every run: each side's median seconds, its baseline's, and the per-repeat ratios."""
    print("\n| size | ranks | side / baseline | side median s | baseline median s | ratio median (range) | goal |")
    print("|---|---|---|---|---|---|---|")
    for result in results:
        for name, ratio in result["ratios"].items():
            base = BASE[name]
            print(
                f"| {result['size']} | {result['ranks']} | {name} / {base} | {result['median_s'][name]:.3f} | "
                f"{result['median_s'][base]:.3f} | {ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f}x) "
                f"| {verdict(name, ratio)} |"
            )
    methods = sorted({result["cache"] for result in results})
    print(f"page cache: {'; '.join(CACHE_METHODS[m] for m in methods)}")


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--sizes", nargs="+", default=["0.6b", "1b", "a3b-2l"], choices=list(SIZES))
    cli.add_argument("--nproc", nargs="+", type=int, default=[1, 2])
    cli.add_argument("--repeats", type=int, default=3)
    cli.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    cli.add_argument("--max-shard-mb", type=int, default=5000, help="--export.max_shard_mb (default 5000: 5GB)")
    cli.add_argument("--new-only", action="store_true", help="leave out the old export (it holds the model twice)")
    cli.add_argument(
        "--cold",
        action="store_true",
        help="drop the page cache before each read and load (drop_caches "
        "where writable, else posix_fadvise of the files)",
    )
    cli.add_argument("--dir", default=None, help="where the safetensors go (default: a temporary folder)")
    cli.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    cli.add_argument("--size", help=argparse.SUPPRESS)
    args = cli.parse_args()
    if args.worker:
        return worker(args)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, (os.path.join(REPO, "recipes"), REPO, os.environ.get("PYTHONPATH")))
        ),
        "MALLOC_MMAP_THRESHOLD_": str(1 << 20),
    }  # freed tensors go back to the kernel: RSS is what is live
    results = []
    for size in args.sizes:
        for nproc in args.nproc:
            with tempfile.TemporaryDirectory(dir=args.dir) as root:
                env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "torch.distributed.run",
                        f"--nproc_per_node={nproc}",
                        "--rdzv_backend",
                        "c10d",
                        "--rdzv_endpoint",
                        "localhost:0",
                        "--local-ranks-filter",
                        "0",
                        "-m",
                        "bench.bench_weights",
                        "--worker",
                        "--size",
                        size,
                        "--dir",
                        root,
                        "--repeats",
                        str(args.repeats),
                        "--dtype",
                        args.dtype,
                        "--max-shard-mb",
                        str(args.max_shard_mb),
                        *(["--new-only"] if args.new_only else []),
                        *(["--cold"] if args.cold else []),
                    ],
                    env=env,
                    cwd=REPO,
                    check=True,
                )
                with open(os.path.join(root, "result.json")) as f:
                    results.append(json.load(f))
    summary(results)


if __name__ == "__main__":
    main()
