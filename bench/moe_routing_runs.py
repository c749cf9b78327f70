"""The launcher-run harness of the two MoE routing benchmarks, bench_moe_balance and bench_router_watch_cost.

Every run is the launcher's own: `python -m entrypoint --dry-run` plans it from the environment (VARIANT=nki_moe,
SCALE, INIT_FROM, STEPS, LR, MOE_AUX_LOSS, MOE_Z_LOSS=0, NPROC, SEQ_LEN), and the planned torchrun command runs
with one change: torchrun starts this module's `--worker` mode in place of `torchtitan.train`. The worker parses the
same torchtitan arguments (`ConfigManager().parse_args`), builds the project's trainer (`config.build()`) and trains
it as torchtitan.train does, timing each `train_step` (time.perf_counter on rank 0) and keeping, after each step,
what the trainer logged: the loss and `trainer.router_watch.last` (per MoE layer the tokens per expert, max/mean
load and router entropy; the NKI experts' block padding; the aux and z losses). Rank 0 writes them to
<run>/router_watch.json. Nothing is read from metrics.jsonl or TensorBoard.

The base model each benchmark trains from (INIT_FROM) is made by this module's `--make-base` mode, in a child, so
the benchmarks' own processes import no torch. `measured` is both benchmarks' main: OUT checked and made, the
measurement run, OUT/results.json written.
"""

import json
import os
import signal
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
    argv = [*argv[: at - 1], "-m", "bench.moe_routing_runs", "--worker", record, watch, *argv[at + 1 :]]
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
        [sys.executable, "-m", "bench.moe_routing_runs", "--make-base", folder, config_name, str(skew)],
        env={**os.environ, **CHECKOUT},
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if result.returncode:
        sys.exit(f"making the base model failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measured(cli, name: str, measure) -> None:
    """A benchmark's main: `cli`'s arguments parsed, OUT (outside the repository) made, results[name] =
    measure(args, OUT), then {"args", name} written to OUT/results.json."""
    args = cli.parse_args()
    args.out = os.path.abspath(args.out)
    if args.out == REPO or args.out.startswith(REPO + os.sep):
        cli.error("OUT must be outside the repository")
    os.makedirs(args.out, exist_ok=True)
    results, begin = {"args": vars(args)}, time.monotonic()
    results[name] = measure(args, args.out)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"figures: {os.path.join(args.out, 'results.json')}; total {time.monotonic() - begin:.0f} s")


if __name__ == "__main__":  # the two modes the benchmarks start: launch's workers, base_model's child
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--make-base":
        make_base(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        sys.exit(
            "usage: --worker RECORD WATCH TITAN_ARGS... | --make-base FOLDER CONFIG SKEW (bench_moe_balance and "
            "bench_router_watch_cost start these)"
        )
