"""Routed experts, forward + backward: NKIGroupedExperts' reference op vs torchtitan's GroupedExperts.

    .venv/bin/python -m bench.bench_moe_experts                 # all shapes, CPU
    .venv/bin/python -m bench.bench_moe_experts --shapes smoke  # seconds
    .venv/bin/python -m bench.bench_moe_experts --device cuda   # on a GPU

Both modules share one set of weights and see the same routed rows (uniform random top-k routing,
rows grouped by expert as torchtitan's dispatcher hands them over). The two are interleaved in
one run (alternating which goes first), so load from other processes hits both alike; we report
the median and the best of each, and reference/grouped_mm as the ratio of the medians.
The reference computes the padded blocks too (the kernel's layout), so its work grows with
slots/rows = N*B / S, printed as "pad"; it approaches 1 as tokens per expert grow past B.
This measures the CPU (or CUDA) reference, not the NKI kernels: those need a Trainium.
On a shared machine `--threads 1` gives steadier numbers (two OpenMP threads stall whenever
another process takes a core).
"""

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

from torchtitan.models.common.moe import GroupedExperts

from neuron_qwen3.moe.experts import NKIGroupedExperts
from neuron_qwen3.moe.layout import blocks_per_expert


@dataclass(frozen=True)
class Shape:
    name: str
    dim: int
    hidden: int
    experts: int
    top_k: int
    tokens: int
    block_size: int


SHAPES = {
    "smoke": [
        # the recipe's smoke MoE model (dim 512, moe hidden 64, 8 experts, top-2), batch 2 x seq 256
        Shape("smoke_moe", 512, 64, 8, 2, 512, 256),
        Shape("smoke_dim64", 64, 128, 4, 2, 256, 32),
    ],
    "qwen3_30b": [
        # one Qwen3-30B-A3B MoE layer (dim 2048, moe hidden 768, 128 experts, top-8), few tokens; the kernels
        # take blocks of 256, 512, 1024 (the config's 256); smaller ones show what padding costs the reference
        Shape("30b_a3b_t512_b256", 2048, 768, 128, 8, 512, 256),
        Shape("30b_a3b_t512_b128", 2048, 768, 128, 8, 512, 128),
        Shape("30b_a3b_t512_b32", 2048, 768, 128, 8, 512, 32),
        Shape("30b_a3b_t2048_b128", 2048, 768, 128, 8, 2048, 128),
    ],
}


def grouped_mm_works(device: torch.device, dtype: torch.dtype) -> bool:
    try:
        a = torch.randn(8, 16, device=device, dtype=dtype)
        b = torch.randn(2, 16, 16, device=device, dtype=dtype)
        torch._grouped_mm(a, b, offs=torch.tensor([4, 8], device=device, dtype=torch.int32))
        return True
    except (RuntimeError, NotImplementedError):
        return False


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(shape: Shape, device: torch.device, param_dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    with torch.device("meta"):  # no fp32 weights allocated and thrown away
        titan = GroupedExperts(GroupedExperts.Config(dim=shape.dim, hidden_dim=shape.hidden, num_experts=shape.experts))
        nki = NKIGroupedExperts(
            NKIGroupedExperts.Config(
                dim=shape.dim, hidden_dim=shape.hidden, num_experts=shape.experts, block_size=shape.block_size
            )
        )
    for name, meta in list(titan.named_parameters()):
        values = torch.randn(meta.shape, generator=gen) * 0.02
        weight = torch.nn.Parameter(values.to(device=device, dtype=param_dtype))
        setattr(titan, name, weight)
        setattr(nki, name, weight)  # one set of weights for both
    logits = torch.randn(shape.tokens, shape.experts, generator=gen)
    ids = logits.topk(shape.top_k, dim=-1).indices
    counts = torch.bincount(ids.reshape(-1), minlength=shape.experts).to(device)
    rows = shape.tokens * shape.top_k
    x = (torch.randn(rows, shape.dim, generator=gen)).to(device=device, dtype=param_dtype)
    grad_out = torch.randn(rows, shape.dim, generator=gen).to(device=device, dtype=param_dtype)
    return titan, nki, x, counts, grad_out


def step(module, x, counts, grad_out, device) -> float:
    for p in module.parameters():
        p.grad = None
    x = x.detach().requires_grad_()
    sync(device)
    start = time.perf_counter()
    module(x, counts).backward(grad_out)
    sync(device)
    return time.perf_counter() - start


def bench(shape: Shape, device: torch.device, param_dtype: torch.dtype, iters: int, warmup: int) -> dict:
    titan, nki, x, counts, grad_out = build(shape, device, param_dtype, seed=0)
    pad = int(blocks_per_expert(counts, shape.block_size).sum()) * shape.block_size / x.shape[0]
    for _ in range(warmup):
        step(titan, x, counts, grad_out, device)
        step(nki, x, counts, grad_out, device)
    times = {"grouped_mm": [], "reference": []}
    for i in range(iters):
        order = [("grouped_mm", titan), ("reference", nki)]
        for name, module in order if i % 2 == 0 else order[::-1]:
            times[name].append(step(module, x, counts, grad_out, device))
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    return {"shape": shape, "pad": pad, "median": med, "best": best, "ratio": med["reference"] / med["grouped_mm"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--shapes", default="all", choices=["all", *SHAPES])
    parser.add_argument("--iters", type=int, default=6, help="timed forward+backward steps per module")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--param-dtype",
        default="bfloat16",
        choices=["bfloat16", "float32"],
        help="weights and activations (bfloat16: as under FSDP mixed precision)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    if args.threads:
        torch.set_num_threads(args.threads)
    param_dtype = getattr(torch, args.param_dtype)
    if not grouped_mm_works(device, torch.bfloat16):
        raise SystemExit(
            f"torch._grouped_mm does not run on {device} in torch {torch.__version__}: "
            "GroupedExperts itself cannot run here, there is nothing to compare against"
        )
    shapes = [s for key, group in SHAPES.items() if args.shapes in ("all", key) for s in group]

    print(
        f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} threads, params {args.param_dtype}; "
        f"torch._grouped_mm runs on {device.type}: GroupedExperts' default path"
    )
    print(
        f"{'shape':22} {'D':>5} {'F':>4} {'E':>4} {'K':>2} {'T':>5} {'B':>4} {'pad':>5} "
        f"{'grouped_mm ms':>14} {'reference ms':>13} {'ratio':>6}   (median; best)"
    )
    for shape in shapes:
        r = bench(shape, device, param_dtype, args.iters, args.warmup)
        med, best = r["median"], r["best"]
        print(
            f"{shape.name:22} {shape.dim:5} {shape.hidden:4} {shape.experts:4} {shape.top_k:2} {shape.tokens:5} "
            f"{shape.block_size:4} {r['pad']:5.2f} {med['grouped_mm'] * 1e3:14.1f} {med['reference'] * 1e3:13.1f} "
            f"{r['ratio']:6.2f}   ({best['grouped_mm'] * 1e3:.1f}; {best['reference'] * 1e3:.1f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
