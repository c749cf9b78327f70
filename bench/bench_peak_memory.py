"""Peak memory where the real-size plan found it: GRPO's and DPO's log-probabilities over Qwen3's vocabulary, and
the generator's prefill at a long bucket, each before and after it was computed in pieces.

    .venv/bin/python -m bench.bench_peak_memory logps   [--positions 4096] [--hidden 256] [--rows 1] [--repeats 3]
    .venv/bin/python -m bench.bench_peak_memory prefill [--bucket 4096] [--slots 1] [--repeats 3]

Each side runs in a fresh child process on CPU in float32; its figure is the child's peak resident memory
(ru_maxrss) less that of a child that makes the same inputs and stops. The sides alternate (ABC, CBA, ...) over
the repeats; printed: each side's median and range in MiB and its ratio to the first side, and the sides' results
checked equal (within 1e-6 of their norm).

logps: hidden states [rows, positions, hidden] through an lm_head to 151,936 tokens, the labels' float32
  log-probabilities and the entropy (GRPO's path; DPO's is the same without the entropy), and the backward of
  their sum. before: the whole window's logits and log-softmax at once, kept for the backward (the code before
  preference/logps.py); whole: token_logps in one chunk of the whole window; chunked: token_logps at logps.TOKENS.
prefill: the cache attention of one layer at Qwen3-4B's heads (32 query heads, 8 KV heads, head dim 128) for a
  prefill of `slots` x `bucket` tokens. before: all the bucket's queries at once (its float32 scores the bucket's
  square, as before query blocks); blocked: plan.QUERY_BLOCK queries at a time.
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys

VOCAB = 151_936
SIDES = {"logps": ("before", "whole", "chunked"), "prefill": ("before", "blocked")}


def logps_side(side: str, args) -> dict:
    import torch

    from neuron_qwen3.preference.logps import TOKENS, token_logps

    torch.manual_seed(0)
    states = (torch.randn(args.rows, args.positions, args.hidden) * 0.1).requires_grad_(True)
    head = torch.nn.Linear(args.hidden, VOCAB, bias=False)
    labels = torch.randint(0, VOCAB, (args.rows, args.positions))
    if side == "inputs":
        return {}
    if side == "before":
        logps = torch.log_softmax(head(states).float(), dim=-1)
        picked = logps.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            entropy = -(logps.exp() * logps).sum(-1)
    else:
        tokens = args.rows * args.positions if side == "whole" else TOKENS
        picked, entropy = token_logps(states, labels, 1.0, head, entropy=True, tokens=tokens)
    picked.sum().backward()
    return {"picked": picked.detach(), "entropy": entropy, "grad": states.grad}


def prefill_side(side: str, args) -> dict:
    import torch

    from neuron_qwen3.generate.cache import KVCache, Step
    from neuron_qwen3.generate.plan import QUERY_BLOCK

    heads, kv_heads, dim = 32, 8, 128
    torch.manual_seed(0)
    q = torch.randn(args.slots, heads, args.bucket, dim)
    k, v = torch.randn(args.slots, kv_heads, args.bucket, dim), torch.randn(args.slots, kv_heads, args.bucket, dim)
    cache = KVCache(1, args.slots, args.bucket, args.bucket if side == "before" else QUERY_BLOCK)
    cache.step = Step(torch.zeros(args.slots, dtype=torch.long), args.bucket, args.bucket)
    if side == "inputs":
        return {}
    with torch.no_grad():
        return {"out": cache.attend(0, q, k, v, dim**-0.5)}


def child(case: str, side: str, args) -> None:
    """One side; its results go to a file the parent compares, its peak to stderr."""
    import torch

    found = (logps_side if case == "logps" else prefill_side)(side, args)
    if found:
        torch.save(found, f"{args.results}.{side}.pt")
    print(json.dumps({"peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}), file=sys.stderr)


def peak_of(case: str, side: str, argv: list) -> float:
    """The child's own peak resident memory in MiB (RUSAGE_CHILDREN would keep the largest child's so far)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_peak_memory", case, "--child", side, *argv], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stderr.strip().splitlines()[-1])["peak_kib"] / 1024


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("case", choices=list(SIDES))
    cli.add_argument("--positions", type=int, default=4096, help="logps: positions a row")
    cli.add_argument("--hidden", type=int, default=256, help="logps: the lm_head's input width")
    cli.add_argument("--rows", type=int, default=1, help="logps: rows")
    cli.add_argument("--bucket", type=int, default=4096, help="prefill: the bucket's tokens")
    cli.add_argument("--slots", type=int, default=1, help="prefill: slots")
    cli.add_argument("--repeats", type=int, default=3)
    cli.add_argument("--results", default="/tmp/bench-peak-memory", help="where the children leave their results")
    cli.add_argument("--child", help=argparse.SUPPRESS)
    args = cli.parse_args()
    if args.child:
        return child(args.case, args.child, args)
    import torch

    argv = sys.argv[2:]
    sides = SIDES[args.case]
    peaks = {side: [] for side in ("inputs", *sides)}
    for repeat in range(args.repeats):
        for side in ("inputs", *(sides if repeat % 2 == 0 else sides[::-1])):
            peaks[side].append(peak_of(args.case, side, argv))
    first = torch.load(f"{args.results}.{sides[0]}.pt")
    for side in sides[1:]:
        for name, value in torch.load(f"{args.results}.{side}.pt").items():
            gap, norm = (value - first[name]).norm().item(), first[name].norm().item()
            assert gap <= 1e-6 * norm, f"{side}: {name} is {gap:.3g} from {sides[0]}'s (norm {norm:.3g})"
    base = statistics.median(peaks["inputs"])
    print(f"{args.case}: {vars(args)}; inputs alone {base:.0f} MiB peak resident (subtracted below)")
    reference = statistics.median(peaks[sides[0]]) - base
    for side in sides:
        found = [p - base for p in peaks[side]]
        middle = statistics.median(found)
        print(f"{side:8s} {middle:8.0f} MiB (range {min(found):.0f}-{max(found):.0f})  x{middle / reference:.3f}")
    print(f"results equal within 1e-6 of their norm: {', '.join(sides[1:])} against {sides[0]}")


if __name__ == "__main__":
    main()
