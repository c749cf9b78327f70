"""MoE routing: does Qwen3-MoE's load-balancing loss even out a skewed router?

    flock /tmp/neuron-qwen3-heavy.lock .venv/bin/python -m bench.bench_moe_balance OUT   # 60 steps a side
    .venv/bin/python -m bench.bench_moe_balance OUT --steps 30     # ~3 min

OUT is a folder outside the repository: the plot, the raw figures (results.json) and every run's OUTPUT_DIR go there.
Every run is the launcher's own, its torchrun workers bench/moe_routing_runs.py's (which says how), each step's
loss and router watch figures (`trainer.router_watch.last`) kept.

The experiment (SCALE=smoke: 2 MoE layers of 4 experts, top-2, 2 x 128 = 256 tokens a step, 1 rank). A random
Qwen3MoeForCausalLM of the smoke shape (seed 0), made and saved by transformers as INIT_FROM, its routers skewed:
the mean gate input m of each layer over 2048 tokens of the bundled corpus (in 128-token windows) is measured
and gate.weight[e] += c * m / |m|^2 for experts 0 and 1, which raises their logits by c on the average token
(--skew c, default 1.0). The same base trains --steps (60) steps at LR=--lr (3e-3) twice, with
MOE_AUX_LOSS=--aux (0.01) and with MOE_AUX_LOSS=0. Printed at a few steps and plotted per step
(OUT/moe_routing.png): max/mean load (the busiest expert's tokens over the mean; 1 = even, 2 = two experts take
every token) of the worst layer and the mean over the layers; the block-padding share (of the kernel's 256-row
block rows); the cross-entropy (the logged loss less the coefficient x aux). Then the mean over the last sixth
of the steps. The expectation tested: max/mean falls with the loss and not without it.
"""

import argparse
import os
import statistics

from bench.moe_routing_runs import CALIBRATION_TOKENS, SKEWED, base_model, launch, measured


def curve(run: dict) -> list:
    """Per logged step: step, worst and mean max/mean over layers, padding, cross-entropy, aux."""
    rows = []
    for s in run["steps"]:
        load = s.get("load")
        if not load:
            continue
        loads = [layer["max_mean"] for layer in load["layers"]]
        rows.append(
            {
                "step": s["step"],
                "worst": max(loads),
                "mean": statistics.mean(loads),
                "layers": loads,
                "padding": load["padding"],
                "aux": load["aux"],
                "ce": s["loss"] - run["aux_coef"] * load["aux"] - run["z_coef"] * load["z"],
                "entropy": statistics.mean(layer["entropy"] for layer in load["layers"]),
            }
        )
    return rows


def plot(curves: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for (name, rows), colour in zip(curves.items(), ("tab:blue", "tab:orange")):
        steps = [r["step"] for r in rows]
        axes[0].plot(steps, [r["worst"] for r in rows], color=colour, label=f"{name}: worst layer")
        axes[0].plot(steps, [r["mean"] for r in rows], color=colour, linestyle="--", label=f"{name}: mean of layers")
        axes[1].plot(steps, [100 * (r["padding"] or 0) for r in rows], color=colour, label=name)
        axes[2].plot(steps, [r["ce"] for r in rows], color=colour, label=name)
    axes[0].set(title="max/mean tokens per expert (1 = even)", xlabel="step")
    axes[1].set(title="NKI experts' block padding (% of block rows)", xlabel="step")
    axes[2].set(title="cross-entropy", xlabel="step")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def experiment(args, root: str) -> dict:
    base = os.path.join(root, "experiment-base")
    made = base_model(base, "nki_moe_qwen3_smoke", args.skew)
    print(
        f"experiment base (smoke shape, skew {args.skew} to experts {list(SKEWED)}): max/mean per layer on "
        f"{CALIBRATION_TOKENS} corpus tokens {made.get('max_mean_after_skew')}, share of top-k picks going to the "
        f"skewed experts {made.get('share_of_skewed')}",
        flush=True,
    )
    sides = {f"MOE_AUX_LOSS={args.aux:g}": args.aux, "MOE_AUX_LOSS=0": 0.0}
    runs = {}
    for name, coef in sides.items():
        settings = {
            "SCALE": "smoke",
            "INIT_FROM": base,
            "STEPS": str(args.steps),
            "LR": str(args.lr),
            "MOE_AUX_LOSS": str(coef),
            "MOE_Z_LOSS": "0",
            "NPROC": "1",
        }
        run = launch(settings, os.path.join(root, f"experiment-aux{coef:g}"), "on", os.path.join(root, "cache"))
        runs[name] = curve(run)
        print(f"  {name}: {len(runs[name])} steps in {run['wall_s']:.0f} s", flush=True)
    marks = sorted({1, 2, 5, 10, 20, 30, 45, args.steps} & {r["step"] for r in next(iter(runs.values()))})
    print(
        f"\nsmoke nki_moe, 1 rank, INIT_FROM the skewed base, LR={args.lr:g}, {args.steps} steps; max/mean is the "
        "busiest expert's tokens over the mean (layers: each layer's), padding the share of 256-row block rows "
        "that are padding, CE the cross-entropy"
    )
    header = "| step | " + " | ".join(f"{n}: max/mean worst (layers) | padding | CE" for n in runs) + " |"
    print(header + "\n|" + "---|" * (1 + 3 * len(runs)))
    for step in marks:
        cells = []
        for rows in runs.values():
            r = next(r for r in rows if r["step"] == step)
            cells += [
                f"{r['worst']:.3f} ({', '.join(f'{v:.2f}' for v in r['layers'])})",
                f"{100 * (r['padding'] or 0):.1f} %",
                f"{r['ce']:.3f}",
            ]
        print(f"| {step} | " + " | ".join(cells) + " |")
    tail = max(1, args.steps // 6)
    summary = {}
    for name, rows in runs.items():
        first = statistics.mean(r["mean"] for r in rows[:3])
        last = statistics.mean(r["mean"] for r in rows[-tail:])
        summary[name] = {
            "first3_mean_max_mean": first,
            f"last{tail}_mean_max_mean": last,
            f"last{tail}_worst": statistics.mean(r["worst"] for r in rows[-tail:]),
            f"last{tail}_padding": statistics.mean(r["padding"] or 0 for r in rows[-tail:]),
            f"last{tail}_ce": statistics.mean(r["ce"] for r in rows[-tail:]),
        }
        print(
            f"{name}: mean-over-layers max/mean, first 3 steps {first:.3f} -> last {tail} steps {last:.3f}; "
            f"worst layer {summary[name][f'last{tail}_worst']:.3f}; padding "
            f"{100 * summary[name][f'last{tail}_padding']:.1f} %; CE {summary[name][f'last{tail}_ce']:.3f}"
        )
    path = os.path.join(args.out, "moe_routing.png")
    plot(runs, path, f"nki_moe smoke, skewed router (c={args.skew:g}), LR {args.lr:g}, 1 rank")
    print(f"plot: {path}", flush=True)
    return {"base": made, "curves": runs, "summary": summary, "plot": path}


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("out", help="where the plot, the figures and the runs go (outside the repository)")
    cli.add_argument("--steps", type=int, default=60, help="training steps per side")
    cli.add_argument("--lr", type=float, default=3e-3, help="LR")
    cli.add_argument("--aux", type=float, default=0.01, help="MOE_AUX_LOSS of the side with the loss")
    cli.add_argument("--skew", type=float, default=1.0, help="logit raise of experts 0-1 (see above)")
    measured(cli, "experiment", experiment)


if __name__ == "__main__":
    main()
