"""Document attention's memory at a long window: its query blocks against one sequence^2 score matrix.

    .venv/bin/python -m bench.bench_attention                 # ~3 min on two cores
    .venv/bin/python -m bench.bench_attention --heads 1 --kv-heads 1 --repeats 1

One forward and backward of attention over a packed window (documents of 1,000 tokens, 8 query heads on 2 kv heads
by default, head dim 64, float32, CPU), in a fresh process per measurement: the reference (attention/reference.py,
the path Neuron runs without its kernels) and transformers' eager attention (`eager_attention_forward`, which
materialises every head's sequence^2 scores, here with an additive document mask). Each process reports its peak
resident memory less what it held just before attention (inputs and gradients allocated), so the figure is what
attention itself allocates, or more if an earlier peak of the process was higher. The two sides alternate; the
spread is over the repeats. The yardstick: one sequence^2 float32 score matrix of one head.
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys

HEAD_DIM, DOCUMENT = 64, 1000


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def measure(side: str, seq: int, heads: int, kv_heads: int) -> dict:
    """In this process: the peak memory one forward and backward of `side` adds over its inputs."""
    import types

    import torch

    from neuron_qwen3.attention import document
    from neuron_qwen3.attention.masks import document_starts

    torch.manual_seed(0)
    positions = (torch.arange(seq) % DOCUMENT)[None]
    q = torch.randn(1, heads, seq, HEAD_DIM, requires_grad=True)
    k, v = (torch.randn(1, kv_heads, seq, HEAD_DIM, requires_grad=True) for _ in range(2))
    upstream = torch.randn(1, heads, seq, HEAD_DIM)
    for t in (q, k, v):
        t.grad = torch.zeros_like(t)  # the gradients' memory counted in the baseline
    starts = document_starts(positions)
    if side == "reference":
        run = lambda: document.document_attention_op(q, k, v, starts, HEAD_DIM**-0.5, "reference")
    else:
        from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward

        index = torch.arange(seq)
        allowed = (index[None, :] >= starts[0, :, None]) & (index[None, :] <= index[:, None])
        mask = torch.zeros(1, 1, seq, seq).masked_fill_(~allowed, float("-inf"))
        module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, training=False)
        run = lambda: eager_attention_forward(module, q, k, v, mask, HEAD_DIM**-0.5)[0].transpose(1, 2)
    baseline = _resident_bytes()  # now, not the peak so far: an earlier peak would hide what attention adds
    run().backward(upstream)
    return {"side": side, "added_bytes": _peak_bytes() - baseline}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", choices=["reference", "eager"], help=argparse.SUPPRESS)  # a measuring child
    args = parser.parse_args()
    shape = ["--seq", str(args.seq), "--heads", str(args.heads), "--kv-heads", str(args.kv_heads)]
    if args.one:
        print(json.dumps(measure(args.one, args.seq, args.heads, args.kv_heads)))
        return
    added = {"reference": [], "eager": []}
    for _ in range(args.repeats):
        for side in added:
            child = [sys.executable, "-m", "bench.bench_attention", *shape, "--one", side]
            done = subprocess.run(child, capture_output=True, text=True, check=True)
            added[side].append(json.loads(done.stdout.splitlines()[-1])["added_bytes"])
    score_matrix = args.seq**2 * 4
    print(f"sequence {args.seq}, {args.heads} query heads on {args.kv_heads} kv heads, head dim {HEAD_DIM}, float32")
    print(f"one sequence^2 float32 score matrix (one head): {score_matrix / 2**20:.0f} MiB")
    for side, values in added.items():
        mib = [value / 2**20 for value in values]
        print(
            f"{side:9s} forward+backward adds {statistics.median(mib):7.0f} MiB (min {min(mib):.0f}, max "
            f"{max(mib):.0f}, {len(mib)} runs) = {statistics.median(values) / score_matrix:.2f} score matrices"
        )


if __name__ == "__main__":
    main()
