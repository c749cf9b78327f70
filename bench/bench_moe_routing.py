"""MoE routing: does Qwen3-MoE's load-balancing loss even out a skewed router, and what does the router watch cost?

    flock /tmp/neuron-qwen3-heavy.lock .venv/bin/python -m bench.bench_moe_routing OUT   # CPU: 13-20 min
    .venv/bin/python -m bench.bench_moe_routing OUT --skip-cost --steps 30     # the experiment alone, ~3 min
    .venv/bin/python -m bench.bench_moe_routing OUT --skip-experiment --cost-nproc 2 --repeats 0   # cost B, 2 ranks

OUT is a folder outside the repository: the plot, the raw figures (results.json) and every run's OUTPUT_DIR go there.

Every run is the launcher's own: `python -m entrypoint --dry-run` plans it from the environment (VARIANT=nki_moe,
SCALE, INIT_FROM, STEPS, LR, MOE_AUX_LOSS, MOE_Z_LOSS=0, NPROC, SEQ_LEN), and the planned torchrun command runs
with one change: torchrun starts this file's `--worker` mode in place of `torchtitan.train`. The worker parses the
same torchtitan arguments (`ConfigManager().parse_args`), builds the project's trainer (`config.build()`) and trains
it as torchtitan.train does, timing each `train_step` (time.perf_counter on rank 0) and keeping, after each step,
what the trainer logged: the loss and `trainer.router_watch.last` (per MoE layer the tokens per expert, max/mean
load and router entropy; the NKI experts' block padding; the aux and z losses). Rank 0 writes them to
<run>/router_watch.json. Nothing is read from metrics.jsonl or TensorBoard.

1. The experiment (SCALE=smoke: 2 MoE layers of 4 experts, top-2, 2 x 128 = 256 tokens a step, 1 rank). A random
   Qwen3MoeForCausalLM of the smoke shape (seed 0), made and saved by transformers as INIT_FROM, its routers skewed:
   the mean gate input m of each layer over 2048 tokens of the bundled corpus (in 128-token windows) is measured
   and gate.weight[e] += c * m / |m|^2 for experts 0 and 1, which raises their logits by c on the average token
   (--skew c, default 1.0). The same base trains --steps (60) steps at LR=--lr (3e-3) twice, with
   MOE_AUX_LOSS=--aux (0.01) and with MOE_AUX_LOSS=0. Printed at a few steps and plotted per step
   (OUT/moe_routing.png): max/mean load (the busiest expert's tokens over the mean; 1 = even, 2 = two experts take
   every token) of the worst layer and the mean over the layers; the block-padding share (of the kernel's 256-row
   block rows); the cross-entropy (the logged loss less the coefficient x aux). Then the mean over the last sixth
   of the steps. The expectation tested: max/mean falls with the loss and not without it.
2. The watch's cost: the watch on (MOE_AUX_LOSS=0: its hooks, statistics, the aux and z graph at coefficient 0,
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
import json
import os
import signal
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKOUT = {"PYTHONPATH": os.pathsep.join((os.path.join(REPO, "recipes"), REPO))}  # this checkout's code, everywhere
SKEWED = (0, 1)  # the experts the skewed router favours
CALIBRATION_TOKENS = 2048


# ---- the base model (a child: the launcher side imports no torch) -----------------------------------------------


def make_base(folder: str, config_name: str, skew: float) -> None:
    """A random Qwen3MoeForCausalLM of `config_name`'s shape, its routers skewed to SKEWED by `skew`, saved."""
    import torch
    import transformers

    from neuron_qwen3 import config_registry
    from neuron_qwen3.hf import weights

    config = getattr(config_registry, config_name)()
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(
        transformers.Qwen3MoeConfig(**weights.native_hf_config(config.model_spec.model, {}))
    )
    report = {"skew": skew}
    if skew:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(config_registry.SMOKE_TOKENIZER))
        with open(config_registry.SMOKE_CORPUS / "train.jsonl") as f:
            text = "\n".join(json.loads(line)["text"] for _, line in zip(range(100), f))
        window = config.training.seq_len  # the windows training sees: positions restart at each
        ids = tokenizer(text, return_tensors="pt").input_ids[0, :CALIBRATION_TOKENS].reshape(-1, window)
        gates = [layer.mlp.gate for layer in model.model.layers]
        seen, picks = {}, {}
        hooks = [
            gate.register_forward_pre_hook(lambda _m, args, i=i: seen.__setitem__(i, args[0].detach()))
            for i, gate in enumerate(gates)
        ]
        with torch.no_grad():
            model(ids)
            for i, gate in enumerate(gates):  # all means from the unskewed model, then every router moved
                x = seen[i].reshape(-1, seen[i].shape[-1])
                mean = x.mean(dim=0)
                gate.weight[list(SKEWED)] += skew * mean / mean.dot(mean)
        for hook in hooks:
            hook.remove()
        hooks = [
            gate.register_forward_hook(lambda _m, _a, out, i=i: picks.__setitem__(i, out[2]))
            for i, gate in enumerate(gates)
        ]
        with torch.no_grad():
            model(ids)
        load = [torch.bincount(picks[i].reshape(-1), minlength=gates[i].num_experts).float() for i in range(len(gates))]
        report["max_mean_after_skew"] = [round(float(c.max() / c.mean()), 3) for c in load]
        report["share_of_skewed"] = [round(float(c[list(SKEWED)].sum() / c.sum()), 3) for c in load]
    model.save_pretrained(folder)
    print(json.dumps(report))


# ---- the worker (under torchrun) --------------------------------------------------------------------------------


def clocked(method, total: list):
    """`method`, its time added to total[0] (the loss and interval calls of the trainer's watch)."""

    def timed(*args, **kwargs):
        begin = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - begin

    return timed


ALTERNATE = ("on", "off", "off", "on")  # watch=alternate: the watch of step k, k = 1, 2, ... (ABBA)


def worker(record: str, watch: str, titan_args: list) -> None:
    """torchtitan.train's main, each step's time and logged figures kept. watch: on (as the trainer builds it),
    off (routing.RouterWatch patched to give None) or alternate (attached; every step of ALTERNATE's `off` runs
    without it: nothing recorded, so its hooks return at once, loss() gives 0 and interval() None)."""
    import torch
    from torchtitan.config import ConfigManager
    from torchtitan.tools.logging import init_logger

    from neuron_qwen3.moe import routing

    init_logger()
    if watch == "off":
        routing.RouterWatch = lambda *args, **kwargs: None  # trainer.py looks it up on the module when it builds
    config = ConfigManager().parse_args(titan_args)
    trainer = config.build()
    assert (trainer.router_watch is None) == (watch == "off"), "the watch is not as asked"
    assert trainer.router_watch is None or trainer.router_watch.layers, "no MoE layers watched"
    steps, train_step, log = [], trainer.train_step, trainer.metrics_processor.log
    in_watch = [0.0]  # seconds inside the watch's loss() and interval() this step
    attached = trainer.router_watch
    if attached is not None:
        for name in ("loss", "interval"):
            setattr(attached, name, clocked(getattr(attached, name), in_watch))

    def timed_step(data_iterator):
        side = ALTERNATE[(trainer.step - 1) % len(ALTERNATE)] if watch == "alternate" else watch
        if watch == "alternate":  # every rank alike: the step number decides
            trainer.router_watch = attached if side == "on" else None  # None: post_dataloading_process skips start()
            attached.logits.clear(), attached.picks.clear()  # nothing recorded: loss() returns 0 at once
        in_watch[0] = 0.0
        begin = time.perf_counter()
        train_step(data_iterator)
        seconds = time.perf_counter() - begin
        entry = {"step": trainer.step, "step_s": seconds, "watch_s": in_watch[0], "side": side}
        if steps and steps[-1].get("step") == trainer.step and "loss" in steps[-1]:
            entry = {**steps.pop(), **entry}
        steps.append(entry)

    def logged(step, loss, max_loss, grad_norm, *args, **kwargs):
        result = log(step, loss, max_loss, grad_norm, *args, **kwargs)  # the watch's interval runs in here
        last = trainer.router_watch.last if trainer.router_watch is not None else None
        steps.append({"step": step, "loss": float(loss), "grad_norm": float(grad_norm), "load": last})
        return result

    trainer.train_step, trainer.metrics_processor.log = timed_step, logged
    try:
        trainer.train()
    finally:
        trainer.close()
    moe = config.moe
    if torch.distributed.get_rank() == 0:
        with open(record, "w") as f:
            json.dump(
                {
                    "watch": watch,
                    "aux_coef": moe.aux_loss,
                    "z_coef": moe.z_loss,
                    "steps": steps,
                    "world": torch.distributed.get_world_size(),
                },
                f,
            )
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# ---- the orchestrator -------------------------------------------------------------------------------------------

PLANS = {}  # settings -> the launcher's plan, made once (a dry run takes ~10 s) with a stand-in OUTPUT_DIR
STAND_IN = "/nonexistent/bench-moe-routing-output"


def planned(env: dict, out: str) -> tuple[list, dict]:
    """The launcher's torchrun command and the environment it adds, for these settings (`--dry-run`), for `out`."""
    key = json.dumps({k: v for k, v in sorted(env.items()) if k != "OUTPUT_DIR"})
    if key not in PLANS:
        result = subprocess.run(
            [sys.executable, "-m", "entrypoint", "--dry-run"],
            env={**env, "OUTPUT_DIR": STAND_IN},
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if result.returncode:
            sys.exit(f"the launcher's dry run failed ({result.returncode}):\n{result.stderr[-3000:]}")
        plan = json.loads(result.stdout[result.stdout.index("{") :])
        PLANS[key] = plan["argv"], plan["env"]
    argv, added = PLANS[key]
    return [a.replace(STAND_IN, out) for a in argv], {k: v.replace(STAND_IN, out) for k, v in added.items()}


def launch(settings: dict, out: str, watch: str, cache: str) -> dict:
    """One run: the planned torchrun command, with this file's worker in place of torchtitan.train."""
    env = {**os.environ, **CHECKOUT, "VARIANT": "nki_moe", "CACHE_DIR": cache, "PREFLIGHT": "warn", **settings}
    argv, added = planned(env, out)
    at = argv.index("torchtitan.train")
    record = os.path.join(out, "router_watch.json")
    argv = [*argv[: at - 1], "-m", "bench.bench_moe_routing", "--worker", record, watch, *argv[at + 1 :]]
    os.makedirs(out, exist_ok=True)
    begin = time.monotonic()
    log_path = os.path.join(out, "train.log")
    with open(log_path, "w") as logfile:
        child = subprocess.Popen(
            argv,
            env={**env, **added, "OUTPUT_DIR": out},
            cwd=REPO,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = child.wait()
        except BaseException:  # interrupted: torchrun stops its workers (each in a session of its own)
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=40)
            except subprocess.TimeoutExpired:
                child.kill()
            raise
    if code or not os.path.exists(record):
        with open(log_path) as f:
            sys.exit(f"run {out} failed ({code}):\n{f.read()[-4000:]}")
    with open(record) as f:
        found = json.load(f)
    found["wall_s"] = time.monotonic() - begin
    return found


def base_model(folder: str, config_name: str, skew: float) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "bench.bench_moe_routing", "--make-base", folder, config_name, str(skew)],
        env={**os.environ, **CHECKOUT},
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if result.returncode:
        sys.exit(f"making the base model failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


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
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], sys.argv[3], sys.argv[4:])
    if len(sys.argv) > 1 and sys.argv[1] == "--make-base":
        return make_base(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("out", help="where the plot, the figures and the runs go (outside the repository)")
    cli.add_argument("--steps", type=int, default=60, help="experiment: training steps per side")
    cli.add_argument("--lr", type=float, default=3e-3, help="experiment: LR")
    cli.add_argument("--aux", type=float, default=0.01, help="experiment: MOE_AUX_LOSS of the side with the loss")
    cli.add_argument("--skew", type=float, default=1.0, help="experiment: logit raise of experts 0-1 (see above)")
    cli.add_argument(
        "--cost-scale",
        default="smoke",
        choices=["bench", "smoke"],
        help="cost: SCALE (bench: nki_moe_qwen3_bench_cpu on CPU, ~2 min a step here)",
    )
    cli.add_argument("--cost-seq-len", type=int, default=2048, help="cost: SEQ_LEN; 0: the config's")
    cli.add_argument("--threads", type=int, default=1, help="cost: OMP_NUM_THREADS per rank; 0: the launcher's")
    cli.add_argument("--cost-nproc", type=int, nargs="+", default=[1, 2])
    cli.add_argument("--cost-steps", type=int, default=12, help="cost: training steps per run")
    cli.add_argument("--warmup", type=int, default=2, help="cost: first steps of a run left out")
    cli.add_argument("--repeats", type=int, default=3, help="cost A: on/off pairs of runs per rank count")
    cli.add_argument(
        "--alternate-steps",
        type=int,
        default=120,
        help="cost B: steps of the run with the watch on and off by turns; 0: none",
    )
    cli.add_argument("--skip-experiment", action="store_true")
    cli.add_argument("--skip-cost", action="store_true")
    args = cli.parse_args()
    args.out = os.path.abspath(args.out)
    if args.out == REPO or args.out.startswith(REPO + os.sep):
        cli.error("OUT must be outside the repository")
    os.makedirs(args.out, exist_ok=True)
    results, begin = {"args": vars(args)}, time.monotonic()
    if not args.skip_experiment:
        results["experiment"] = experiment(args, args.out)
    if not args.skip_cost:
        results["cost"] = cost(args, args.out)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"figures: {os.path.join(args.out, 'results.json')}; total {time.monotonic() - begin:.0f} s")


if __name__ == "__main__":
    main()
