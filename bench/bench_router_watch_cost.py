"""MoE routing: what does Qwen3-MoE's router watch cost a training step?

    flock /tmp/neuron-qwen3-heavy.lock .venv/bin/python -m bench.bench_router_watch_cost OUT   # 1 and 2 ranks, A, B
    .venv/bin/python -m bench.bench_router_watch_cost OUT --cost-nproc 2 --repeats 0   # B alone, 2 ranks

OUT is a folder outside the repository: the raw figures (results.json) and every run's OUTPUT_DIR go there.
Every run is the launcher's own, its torchrun workers bench/moe_routing_runs.py's (which says how), each
train_step timed on rank 0.

The watch's cost: the watch on (MOE_AUX_LOSS=0: its hooks, statistics, the aux and z graph at coefficient 0,
the all-reduce, its metrics) against off. nki_moe_qwen3_bench_cpu (SCALE=bench on CPU) took ~2 min a step on
this 2-core host (16 tokens/s, 8.6 GiB, 1 rank, others' tests running), so the default is the largest that
gives steps of about a second: the smoke model at SEQ_LEN=2048 (2 x 2048 tokens a step), OMP_NUM_THREADS=1 per
rank (--cost-scale bench --cost-seq-len 0 for the bench_cpu config itself). An unskewed random base as
INIT_FROM; 1 and 2 ranks (--cost-nproc). Two ways:
A. whole runs of --cost-steps (12) steps, watch on, and off with `neuron_qwen3.moe.routing.RouterWatch` replaced by
   one returning None in the worker (no hooks, no loss, no metrics); on/off then off/on per repeat (--repeats
   3); each run's time the median of its steps after the first --warmup (2); printed: the median of the
   per-repeat on/off ratios and their range. Also, inside the on runs, the share of each step spent in the
   watch's loss() and interval() (timed around them).
B. one run of --alternate-steps (120) steps, the watch attached and used by turns, on off off on ...: an off step
   records nothing (the trainer's router_watch set to None for it, so start() is not called; the hooks return
   at once, loss() gives 0, interval() None). The first 4 steps left out; printed: the median, quartiles and
   range of on/off over adjacent pairs of steps, and the share of the on steps in loss() and interval(). Load
   from other processes drifts over seconds, so B sees far less of it than A, but its off steps keep the hooks'
   empty calls.
Goal: on / off <= 1.01 (the metrics and the losses cost at most 1 % of a step).
"""

import argparse
import os
import statistics

from bench.moe_routing_runs import ALTERNATE, base_model, launch, measured


def spread(values: list) -> str:
    return f"{min(values):.3f}-{max(values):.3f}"


def quartiles(values: list) -> str:
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return f"{q1:.3f}-{q3:.3f}"


def cost(args, root: str) -> dict:
    config_name = "nki_moe_qwen3_bench_cpu" if args.cost_scale == "bench" else "nki_moe_qwen3_smoke"
    base = os.path.join(root, f"cost-base-{args.cost_scale}")
    base_model(base, config_name, 0.0)  # unskewed: the load a random model routes
    cache, found = os.path.join(root, "cache"), {}
    for nproc in args.cost_nproc:
        settings = {
            "SCALE": args.cost_scale,
            "INIT_FROM": base,
            "MOE_AUX_LOSS": "0",
            "MOE_Z_LOSS": "0",
            "NPROC": str(nproc),
            **({"SEQ_LEN": str(args.cost_seq_len)} if args.cost_seq_len else {}),
            **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}),
        }
        times, ratios, shares = {"on": [], "off": []}, [], []
        for repeat in range(args.repeats):  # A: whole runs, the watch attached or not
            here = {}
            for watch in ("on", "off") if repeat % 2 == 0 else ("off", "on"):
                run = launch(
                    {**settings, "STEPS": str(args.cost_steps)},
                    os.path.join(root, f"cost-{nproc}r-{repeat}-{watch}"),
                    watch,
                    cache,
                )
                kept = [s for s in run["steps"] if "step_s" in s][args.warmup :]
                here[watch] = statistics.median(s["step_s"] for s in kept)
                times[watch].append(here[watch])
                line = (
                    f"  A {nproc} rank(s), repeat {repeat}, watch {watch}: median {here[watch]:.3f} s/step over "
                    f"{len(kept)} steps ({spread([s['step_s'] for s in kept])})"
                )
                if watch == "on":  # the watch's own calls, timed inside the same steps
                    shares.append(statistics.median(s["watch_s"] / s["step_s"] for s in kept))
                    line += f"; loss() + interval() {100 * shares[-1]:.3f} % of a step (median)"
                print(f"{line}; run {run['wall_s']:.0f} s", flush=True)
            ratios.append(here["on"] / here["off"])
        alternate = {}
        if args.alternate_steps:  # B: one run, the watch on and off by turns (on off off on ...)
            run = launch(
                {**settings, "STEPS": str(args.alternate_steps)},
                os.path.join(root, f"cost-{nproc}r-alternate"),
                "alternate",
                cache,
            )
            kept = [s for s in run["steps"] if "step_s" in s][len(ALTERNATE) :]  # a whole ABBA round left out
            pairs = [(a, b) for a, b in zip(kept[::2], kept[1::2]) if {a["side"], b["side"]} == {"on", "off"}]
            pair_ratios = [
                (a if a["side"] == "on" else b)["step_s"] / (b if a["side"] == "on" else a)["step_s"] for a, b in pairs
            ]
            on_s = [s["step_s"] for s in kept if s["side"] == "on"]
            off_s = [s["step_s"] for s in kept if s["side"] == "off"]
            alternate = {
                "pair_ratios": pair_ratios,
                "median_pair_ratio": statistics.median(pair_ratios),
                "on_s": statistics.median(on_s),
                "off_s": statistics.median(off_s),
                "ratio_of_medians": statistics.median(on_s) / statistics.median(off_s),
                "watch_share": statistics.median(s["watch_s"] / s["step_s"] for s in kept if s["side"] == "on"),
            }
            print(
                f"  B {nproc} rank(s), {len(kept)} steps by turns: on {alternate['on_s']:.3f} s/step, off "
                f"{alternate['off_s']:.3f}; on / off of adjacent steps, median {alternate['median_pair_ratio']:.4f} "
                f"(quartiles {quartiles(pair_ratios)}, range {spread(pair_ratios)}, {len(pair_ratios)} pairs); "
                f"loss() + interval() {100 * alternate['watch_share']:.3f} % of an on step; "
                f"run {run['wall_s']:.0f} s",
                flush=True,
            )
        found[nproc] = {
            "on_s": times["on"],
            "off_s": times["off"],
            "ratios": ratios,
            "watch_share": shares,
            "median_ratio": statistics.median(ratios) if ratios else None,
            "alternate": alternate,
        }
    tokens = f"SEQ_LEN={args.cost_seq_len}" if args.cost_seq_len else "the config's sequence length"
    print(
        f"\nthe router watch's cost, {config_name} ({tokens}, OMP_NUM_THREADS={args.threads or 'the launcher'}); "
        f"on: the watch with MOE_AUX_LOSS=0. A: {args.repeats} pairs of runs of {args.cost_steps} steps (the first "
        f"{args.warmup} left out), on/off and off/on by turns, off = routing.RouterWatch patched to give None. "
        "B: one run of "
        f"{args.alternate_steps} steps, the watch on and off by turns (on off off on), off = nothing recorded"
    )
    print(
        "| ranks | A: on / off, median of repeats (range) | A: on, off s/step | B: on / off, adjacent steps, median "
        "(quartiles; range) | B: on, off s/step | watch's loss() + interval(), share of an on step "
        "(A median, range) |"
    )
    print("|---|---|---|---|---|---|")
    for nproc, f in found.items():
        b = f["alternate"]
        a_cells = (
            (
                f"{f['median_ratio']:.4f} ({spread(f['ratios'])})",
                f"{statistics.median(f['on_s']):.3f}, {statistics.median(f['off_s']):.3f}",
            )
            if f["ratios"]
            else ("-", "-")
        )
        b_cells = (
            (
                f"{b['median_pair_ratio']:.4f} ({quartiles(b['pair_ratios'])}; {spread(b['pair_ratios'])})",
                f"{b['on_s']:.3f}, {b['off_s']:.3f}",
            )
            if b
            else ("-", "-")
        )
        share = (
            f"{100 * statistics.median(f['watch_share']):.3f} % ({100 * min(f['watch_share']):.3f}-"
            f"{100 * max(f['watch_share']):.3f} %)"
            if f["watch_share"]
            else "-"
        )
        print(f"| {nproc} | {a_cells[0]} | {a_cells[1]} | {b_cells[0]} | {b_cells[1]} | {share} |")
    for nproc, f in found.items():
        for name, ratio in (("A", f["median_ratio"]), ("B", (f["alternate"] or {}).get("median_pair_ratio"))):
            if ratio is not None:
                print(
                    f"goal (on / off <= 1.01), {name}, {nproc} rank(s): {'met' if ratio <= 1.01 else 'missed'} "
                    f"({ratio:.4f})"
                )
    return {"config": config_name, "runs": found}


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("out", help="where the figures and the runs go (outside the repository)")
    cli.add_argument(
        "--cost-scale",
        default="smoke",
        choices=["bench", "smoke"],
        help="SCALE (bench: nki_moe_qwen3_bench_cpu on CPU, ~2 min a step here)",
    )
    cli.add_argument("--cost-seq-len", type=int, default=2048, help="SEQ_LEN; 0: the config's")
    cli.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per rank; 0: the launcher's")
    cli.add_argument("--cost-nproc", type=int, nargs="+", default=[1, 2])
    cli.add_argument("--cost-steps", type=int, default=12, help="training steps per run")
    cli.add_argument("--warmup", type=int, default=2, help="first steps of a run left out")
    cli.add_argument("--repeats", type=int, default=3, help="A: on/off pairs of runs per rank count")
    cli.add_argument(
        "--alternate-steps",
        type=int,
        default=120,
        help="B: steps of the run with the watch on and off by turns; 0: none",
    )
    measured(cli, "cost", cost)


if __name__ == "__main__":
    main()
