"""What each DPO reference costs: peak memory and step time as ratios to SFT on the same model and windows.

    flock /tmp/neuron-qwen3-heavy.lock .venv/bin/python -m bench.bench_dpo            # CPU: ~16 min
    .venv/bin/python -m bench.bench_dpo --seq-len 2048 --repeats 1

Six runs through the launcher at SCALE=bench (CPU: the 0.2B bench_cpu shape), VARIANT=native, 1 rank, all from
one random base (INIT_FROM) and with the same window shape (--seq-len x the local batch), so a step computes on
the same number of positions whatever the data:
  sft          full fine-tuning on the pairs' chosen conversations (SFT data of the same records)
  dpo-frozen   full fine-tuning, METHOD=dpo, the reference a frozen copy of INIT_FROM (the default without LoRA)
  dpo-precomputed  the same with DPO_PRECOMPUTE_REF=1: one pass over every pair at the first step, then no
               reference forward and no reference weights
  lora-sft     LORA_RANK=--rank on the chosen conversations
  lora-off     LORA_RANK=--rank, METHOD=dpo, the reference the base with the adapters off (the default with LoRA)
  lora-frozen  LORA_RANK=--rank, METHOD=dpo, DPO_REFERENCE=INIT_FROM: a second, frozen copy
They alternate in that order for --repeats rounds, so load from other processes hits all alike. Per run: the
median step time after the first two steps and the peak memory torchtitan logs (on CPU the process's peak RSS).
Printed: each DPO run's ratio to its SFT twin (full or LoRA), the median over the rounds and the range, and the
precomputed run's first pass in seconds (in its first step, which the median leaves out).
"""

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile

from bench.bench_lora import CHECKOUT, REPO, WARMUP, base_model

WORDS = (
    "the river stone cloud tiger lemon piano candle forest silver rocket garden violin meadow harbor castle "
    "pepper marble falcon orange winter summer anchor bridge quiet bright early"
).split()


def sentence(rng, n) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def write_data(root: str, count: int) -> tuple[str, str]:
    """(pairs, the chosen conversations as SFT records) of `count` random questions and answers."""
    rng = random.Random(0)
    pairs, chats = [], []
    for _ in range(count):
        prompt = [{"role": "user", "content": sentence(rng, 12)}]
        chosen, rejected = sentence(rng, 20), sentence(rng, 20)
        pairs.append(
            {
                "prompt": prompt,
                "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}],
            }
        )
        chats.append({"messages": prompt + [{"role": "assistant", "content": chosen}]})
    paths = os.path.join(root, "pairs.jsonl"), os.path.join(root, "chats.jsonl")
    for path, rows in zip(paths, (pairs, chats)):
        with open(path, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return paths


def run(name: str, env: dict, out: str) -> dict:
    env = {
        **os.environ,
        **CHECKOUT,
        "VARIANT": "native",
        "SCALE": "bench",
        "OUTPUT_DIR": out,
        "SAMPLE_PROMPTS": "",
        "CACHE_DIR": os.path.join(out, "cache"),
        **env,
    }
    result = subprocess.run([sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"{name} failed ({result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}")
    records = [json.loads(line) for line in open(os.path.join(out, "report", "metrics.jsonl")) if '"loss"' in line]
    first_pass = re.search(r"pairs computed in ([\d.]+) s", result.stdout + result.stderr)
    return {
        "step_s": statistics.median(r["step_time_s"] for r in records[WARMUP:]),
        "peak_gib": max(r["memory_gib"] for r in records),
        "pass_s": float(first_pass[1]) if first_pass else None,
    }


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--seq-len", type=int, default=512)
    cli.add_argument("--steps", type=int, default=6)
    cli.add_argument("--repeats", type=int, default=2)
    cli.add_argument("--rank", type=int, default=16)
    cli.add_argument("--dir", default=None, help="where the base and the runs go (default: a temporary folder)")
    args = cli.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        base = os.path.join(root, "base")
        base_model("native", base)
        pairs, chats = write_data(root, 40)  # what the steps read; the precomputed run's first pass reads them all
        common = {"INIT_FROM": base, "STEPS": str(args.steps), "SEQ_LEN": str(args.seq_len), "WARMUP_STEPS": "0"}
        lora = {"LORA_RANK": str(args.rank)}
        runs = {
            "sft": {"DATASET": chats, "DATASET_FIELD": "messages"},
            "dpo-frozen": {"DATASET": pairs, "METHOD": "dpo"},
            "dpo-precomputed": {"DATASET": pairs, "METHOD": "dpo", "DPO_PRECOMPUTE_REF": "1"},
            "lora-sft": {"DATASET": chats, "DATASET_FIELD": "messages", **lora},
            "lora-off": {"DATASET": pairs, "METHOD": "dpo", **lora},
            "lora-frozen": {"DATASET": pairs, "METHOD": "dpo", "DPO_REFERENCE": base, **lora},
        }
        rows = {name: [] for name in runs}
        for i in range(args.repeats):
            for name, env in runs.items():
                rows[name].append(run(name, {**common, **env}, os.path.join(root, f"{name}-{i}")))
    print(
        f"native SCALE=bench (CPU: bench_cpu), 1 rank, windows of {args.seq_len}, {args.steps} steps x "
        f"{args.repeats} rounds, LoRA rank {args.rank}"
    )
    print(f"{'run':<17}{'step s':>9}{'peak GiB':>10}   ratio to its SFT twin: step time, peak memory (median, range)")
    for name, measured in rows.items():
        twin = "lora-sft" if name.startswith("lora") else "sft"
        step = statistics.median(r["step_s"] for r in measured)
        peak = statistics.median(r["peak_gib"] for r in measured)
        line = f"{name:<17}{step:>9.3f}{peak:>10.2f}"
        if name != twin:
            ratios = [(r["step_s"] / t["step_s"], r["peak_gib"] / t["peak_gib"]) for r, t in zip(measured, rows[twin])]
            times, peaks = zip(*ratios)
            line += (
                f"   {statistics.median(times):.2f} ({min(times):.2f}-{max(times):.2f}), "
                f"{statistics.median(peaks):.2f} ({min(peaks):.2f}-{max(peaks):.2f})"
            )
        if measured[0]["pass_s"] is not None:
            line += f"   first pass {statistics.median(r['pass_s'] for r in measured):.1f} s"
        print(line)


if __name__ == "__main__":
    main()
