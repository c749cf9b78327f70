"""On a CUDA host: the three variants compared at SCALE=bench, eager and compiled, through the launcher and by hand.

SCALE=bench with a GPU is Qwen3-1.7B's shape (the MoE twin: 32 experts of 768, top 8, the same active width),
bf16 parameters in compute, sequence 4096, local batch 1 (recipes/neuron_qwen3/config_registry.py). Each variant
runs with COMPILE=0 and COMPILE=1, once through `python -m entrypoint` and once through the very same torchrun
command and environment typed by hand (taken from `--dry-run`). Every figure comes from the runs' own
report/summary.json (steady-state median tokens/s after two warm-up steps, MFU against torchtitan's peak for
the GPU). Prints one row per run and the ratios: launcher / by hand, compiled / eager.

Never run on this project's CPU machines (it would train 1.7B models); run from the repo root on a GPU host:
    .venv/bin/python -m bench.gpu_compare [--steps 20] [--out outputs/gpu_compare] [--variants native v5]
A run that fails is reported with its status and the rest go on.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from entrypoint.variants import VARIANTS

REPO = Path(__file__).resolve().parent.parent


def run(variant: str, compiled: bool, how: str, steps: int, out: Path) -> dict:
    """One training run; its summary.json (or the exit status when it left none)."""
    folder = out / f"{variant}-{'compile' if compiled else 'eager'}-{how}"
    env = {
        **os.environ,
        "VARIANT": variant,
        "SCALE": "bench",
        "COMPILE": str(int(compiled)),
        "STEPS": str(steps),
        "OUTPUT_DIR": str(folder),
        "CACHE_DIR": str(out / "cache"),
    }
    launcher = [sys.executable, "-m", "entrypoint"]
    if how == "launcher":
        argv, run_env = launcher, env
    else:  # the command the launcher would run, typed by hand
        plan = json.loads(
            subprocess.run(
                [*launcher, "--dry-run"], env=env, cwd=REPO, check=True, capture_output=True, text=True
            ).stdout
        )
        argv, run_env = plan["argv"], {**env, **plan["env"]}
    print(f"gpu_compare: {folder.name}", flush=True)
    with open(out / f"{folder.name}.log", "w") as log:
        code = subprocess.call(argv, env=run_env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    summary_path = folder / "report" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return {"variant": variant, "compiled": compiled, "how": how, "exit": code, "summary": summary}


def _fmt(value, digits=1):
    return "-" if value is None else f"{value:,.{digits}f}"


def report(results: list) -> str:
    by_key = {(r["variant"], r["compiled"], r["how"]): r for r in results}
    tps = lambda key: by_key.get(key, {}).get("summary", {}).get("tokens_per_s")  # noqa: E731
    lines = [
        "| variant | mode | exit | end | tokens/s launcher | tokens/s by hand | launcher/by hand | MFU % "
        "| compiled/eager (launcher) |",
        "|" + "---|" * 9,
    ]
    for variant in dict.fromkeys(r["variant"] for r in results):
        for compiled in (False, True):
            launched, by_hand = tps((variant, compiled, "launcher")), tps((variant, compiled, "by-hand"))
            r = by_key.get((variant, compiled, "launcher"), {"exit": None, "summary": {}})
            eager = tps((variant, False, "launcher"))
            speedup = launched / eager if compiled and launched and eager else None
            ratio = launched / by_hand if launched and by_hand else None
            lines.append(
                f"| {variant} | {'compile' if compiled else 'eager'} | {r['exit']} | "
                f"{r['summary'].get('end', '-')} | {_fmt(launched)} | {_fmt(by_hand)} | {_fmt(ratio, 3)} | "
                f"{_fmt((r['summary'].get('mfu') or {}).get('pct'), 2)} | {_fmt(speedup, 2)} |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    cli = argparse.ArgumentParser(prog="python -m bench.gpu_compare", description=__doc__.split("\n\n")[0])
    cli.add_argument("--steps", type=int, default=20)
    cli.add_argument("--out", type=Path, default=REPO / "outputs" / "gpu_compare")
    cli.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    args = cli.parse_args(argv)
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True, text=True
    )
    if probe.stdout.strip() != "True":
        print("gpu_compare: no CUDA device here; this benchmark needs one", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for variant in args.variants:
        for compiled in (False, True):
            for how in ("launcher", "by-hand"):  # side by side, so a drifting machine shows in both
                results.append(run(variant, compiled, how, args.steps, args.out))
    table = report(results)
    print(table)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
