"""LoRA against full fine-tuning at SCALE=bench, side by side in one run, through the launcher.

    flock /tmp/neuron-qwen3-heavy.lock .venv/bin/python -m bench.bench_lora              # CPU: ~5 min
    .venv/bin/python -m bench.bench_lora --variant nki_moe --rank 16 --steps 6

Both runs start from one base (a random model of the bench shape, saved by transformers: LoRA needs INIT_FROM, and
so the full run loads the same weights) and train the same data with the same settings; they alternate
(full, LoRA, full, LoRA ... for --repeats) so load from other processes hits both alike. Per run: the step time
(median of the steps after the first two, which build graphs), the peak memory torchtitan logs (on CPU the
process's peak RSS), and the bytes rank 0 holds after step 1 in gradients and optimizer state, measured in the
worker (neuron_qwen3/lora/adapters.py: log_state_bytes). The claim checked: gradients and optimizer state shrink as the
trainable fraction (LoRA's trainable parameters over full fine-tuning's) does: each LoRA / full ratio is printed
beside it, and asserted within 1% of it.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKOUT = {"PYTHONPATH": os.pathsep.join((os.path.join(REPO, "recipes"), REPO))}  # this checkout's code, everywhere
COLOUR = (
    r"\x1b\[[0-9;]*m"  # torchtitan's terminal colours (neuron_qwen3/prelaunch/selftest.py), stripped before matching
)
STATE = re.compile(
    r"state after step 1 on this rank: ([\d,]+) trainable parameters; parameters ([\d.]+) MiB, "
    r"gradients ([\d.]+) MiB \((\d+) tensors\), optimizer state ([\d.]+) MiB"
)
WARMUP = 2


def base_model(variant: str, folder: str) -> None:
    """A random model of the shape the bench config trains here (the launcher picks the CPU twin on a CPU host), as
    transformers saves it; in a child, as the launcher side imports no torch."""
    code = (
        "import importlib.util, sys, torch, transformers\n"
        "from entrypoint.variants import VARIANTS\n"
        "from neuron_qwen3 import config_registry, shapes\n"
        "from neuron_qwen3.prelaunch import model_folder\n"
        "accelerated = torch.cuda.is_available() or importlib.util.find_spec('torch_neuronx') is not None\n"
        f"config = getattr(config_registry, VARIANTS[{variant!r}].configs['bench' if accelerated else 'bench_cpu'])()\n"
        "torch.manual_seed(0)\n"
        "hf = transformers.AutoConfig.for_model(**shapes.hf_config(model_folder.trained_shape(config)))\n"
        "transformers.AutoModelForCausalLM.from_config(hf).save_pretrained(sys.argv[1])\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, folder], env={**os.environ, **CHECKOUT}, check=True, capture_output=True
    )


def run(variant: str, base: str, steps: int, out: str, lora: dict) -> dict:
    env = {
        **os.environ,
        **CHECKOUT,
        "VARIANT": variant,
        "SCALE": "bench",
        "INIT_FROM": base,
        "STEPS": str(steps),
        "OUTPUT_DIR": out,
        "CACHE_DIR": os.path.join(out, "cache"),
        **lora,
    }
    begin = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True)
    text = re.sub(COLOUR, "", result.stdout + result.stderr)
    if result.returncode:
        sys.exit(f"{'LoRA' if lora else 'full'} run failed ({result.returncode}):\n{text[-3000:]}")
    records = [json.loads(line) for line in open(os.path.join(out, "report", "metrics.jsonl"))]
    state = STATE.search(text)
    return {
        "step_s": statistics.median(r["step_time_s"] for r in records[WARMUP:]),
        "peak_gib": max(r["memory_gib"] for r in records),
        "wall_s": time.monotonic() - begin,
        "trainable": int(state[1].replace(",", "")),
        "params_mib": float(state[2]),
        "grads_mib": float(state[3]),
        "grad_tensors": int(state[4]),
        "optimizer_mib": float(state[5]),
    }


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--variant", default="native", choices=["native", "nki_moe", "v5"])
    cli.add_argument("--rank", type=int, default=16)
    cli.add_argument("--targets", default=None, help="LORA_TARGETS (default: the variant's)")
    cli.add_argument("--steps", type=int, default=5)
    cli.add_argument("--repeats", type=int, default=1)
    cli.add_argument("--dir", default=None, help="where the base and the runs go (default: a temporary folder)")
    args = cli.parse_args()
    lora = {"LORA_RANK": str(args.rank), **({"LORA_TARGETS": args.targets} if args.targets else {})}
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        base = os.path.join(root, "base")
        base_model(args.variant, base)
        rows = {"full": [], "LoRA": []}
        for i in range(args.repeats):
            rows["full"].append(run(args.variant, base, args.steps, os.path.join(root, f"full-{i}"), {}))
            rows["LoRA"].append(run(args.variant, base, args.steps, os.path.join(root, f"lora-{i}"), lora))
    full, low = ({key: statistics.median(r[key] for r in rs) for key in rs[0]} for rs in rows.values())
    share = low["trainable"] / full["trainable"]  # of what full fine-tuning trains: every base parameter
    print(
        f"{args.variant} SCALE=bench, {args.steps} steps x {args.repeats}, LoRA rank {args.rank}: "
        f"{low['trainable']:,.0f} trainable parameters against {full['trainable']:,.0f} (trainable fraction "
        f"{share:.4%})"
    )
    print(f"{'':<10}{'step s':>9}{'peak GiB':>10}{'params MiB':>12}{'grads MiB':>11}{'optim MiB':>11}{'wall s':>8}")
    for name, r in (("full", full), ("LoRA", low)):
        print(
            f"{name:<10}{r['step_s']:>9.3f}{r['peak_gib']:>10.2f}{r['params_mib']:>12.1f}{r['grads_mib']:>11.2f}"
            f"{r['optimizer_mib']:>11.2f}{r['wall_s']:>8.1f}"
        )
    grads, optimizer = low["grads_mib"] / full["grads_mib"], low["optimizer_mib"] / full["optimizer_mib"]
    print(
        f"LoRA / full: step time {low['step_s'] / full['step_s']:.3f}, peak memory "
        f"{low['peak_gib'] / full['peak_gib']:.3f}, gradients {grads:.4%}, optimizer state {optimizer:.4%} "
        f"(trainable fraction {share:.4%})"
    )
    for label, ratio in (("gradients", grads), ("optimizer state", optimizer)):
        assert abs(ratio - share) <= 0.01 * share, f"{label}: LoRA / full {ratio:.4%} is not the trainable fraction"


if __name__ == "__main__":
    main()
