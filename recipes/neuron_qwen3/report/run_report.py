"""Every run's report in $OUTPUT_DIR/report/: metrics.jsonl, summary.json, loss.png, throughput.png, on a MoE
model experts.png, with METHOD=dpo dpo.png.

metrics.jsonl holds one line per logged training step and, with VALIDATION, one `validation_loss` line per
validation (the validator's mean over the whole validation set); loss.png draws both. On a MoE model each step's
line also holds the experts' load over the logging interval (`moe`, from moe/routing.py's watch: tokens per
expert summed over the ranks, max/mean and router entropy per layer, the NKI experts' block padding, the router
losses) and, when the interval is that step alone, its cross-entropy apart (`loss_ce`: torchtitan's loss holds
the router losses); summary.json's `moe` is the last interval's worst layer, experts.png its tokens per expert.
With METHOD=dpo each step's line, and each validation line, also holds `dpo`: the means over the pairs of the
DPO loss, the rewards (chosen, rejected, margin), the preference accuracy and the log-probabilities, and the SFT
term (preference/dpo.py); summary.json's `dpo` is the last logged step's, dpo.png draws them. With METHOD=grpo
each step's line holds `grpo`: each reward's mean and std, completion lengths, the clipped and zero-std shares,
entropy, KL, the sampler's difference from the learner, and the interval's seconds generating, scoring and
training (rl/); summary.json's `grpo` is the last logged step's. Its validation lines hold `grpo` too: the
held-out prompts' mean rewards, whose total, negated, is their validation loss (rl/validation.py).
summary.json's `data` is what the data gave up to the last logged step, over every rank (data_read.py): records,
tokens trained, masked and padding, a mix's records and tokens by source, and the token cache's hit and time.

Written by the metrics rank (rank 0 without pipeline parallelism) through torchtitan's own metrics machinery:
`ReportLogger` is one more logger backend in the MetricsProcessor's LoggerContainer, next to TensorBoard, so
each record holds exactly what torchtitan logged at that step. The report also replaces torchtitan's per-model
FLOPs count with flops.py's (one formula for all three variants) and its peak with an honest one; on a device
without a known peak, MFU is left out the way upstream leaves it out for quantized runs.

How a run ended (summary.json "end"): `finished` when it ran all its steps; `stopped` when a stop signal came
(the stop code calls `mark_stopped`, or SIGTERM reaches the handler `watch` installs) or training returned
early; `failed` on any other exception.
"""

import contextlib
import json
import math
import os
import signal
import statistics
import time
from importlib import metadata
from pathlib import Path

from torchtitan.components.metrics import BaseLogger, _get_metrics_rank
from torchtitan.tools import utils
from torchtitan.tools.logging import logger

from neuron_qwen3 import shapes
from neuron_qwen3.quirks import devices
from neuron_qwen3.report import flops
from neuron_qwen3.report.plots import plot_experts, plot_loss, plot_preference, plot_throughput

FOLDER = "report"
WARMUP_STEPS = 2  # steps left out of the steady state: the first builds the graphs (and compiles, COMPILE=1)
# The image installs neuron-qwen3 with its git revision as the local version label (0.4.0+<revision>).
VERSIONED = ("neuron-qwen3", "torch", "torchtitan", "transformers", "torch-neuronx")

_stop = {"reason": None}  # set by mark_stopped: the signal or request that stopped this process


def mark_stopped(reason: str) -> None:
    """Record that this run is being stopped on purpose (the stop code calls it; so does the SIGTERM handler)."""
    _stop["reason"] = _stop["reason"] or reason


def record_of(metrics: dict, step: int, steps_since_last: int, world_size: int, log_freq: int) -> dict:
    """One metrics.jsonl line from the dict torchtitan's MetricsProcessor.log hands its loggers."""
    lr = next((value for key, value in metrics.items() if key.startswith("lr/")), None)
    tps = metrics["throughput(tps)"]  # tokens/s per device, as torchtitan computes it
    return {
        "step": step,
        "time": time.time(),
        "loss": metrics["loss_metrics/global_avg_loss"],
        "grad_norm": metrics["grad_norm"],
        "lr": lr,
        "tokens_per_s_per_device": tps,
        "tokens_per_s": tps * world_size,
        # upstream divides the time since the last log by log_freq, even when fewer steps ran (step 1)
        "step_time_s": metrics["time_metrics/end_to_end(s)"] * log_freq / steps_since_last,
        "data_loading_s": metrics["time_metrics/data_loading(s)"],
        "tflops_per_device": metrics["tflops"],
        "mfu_pct": metrics.get("mfu(%)"),
        "memory_gib": metrics["memory/max_reserved(GiB)"],
        "tokens_seen": metrics.get("n_tokens_seen"),
    }


def _method(metrics: dict, prefix: str, name: str) -> dict:
    """{name: the metrics under `prefix`}, or {}: METHOD=dpo's means over the pairs (preference/dpo.py), METHOD=
    grpo's rewards, completions, clipping and timings (rl/)."""
    found = {key[len(prefix) :]: value for key, value in metrics.items() if key.startswith(prefix)}
    return {name: found} if found else {}


def moe_record(load: dict) -> dict:
    """The experts' load of one logging interval (RouterWatch.interval) as metrics.jsonl holds it; the NaN of a
    layer that routed nothing is null (strict JSON)."""
    return {
        "aux_loss": load["aux"],
        "z_loss": load["z"],
        "block_padding": load["padding"],
        "layers": [
            {"tokens": layer["tokens"], "max_mean": _finite(layer["max_mean"]), "entropy": _finite(layer["entropy"])}
            for layer in load["layers"]
        ],
    }


def loss_ce(loss: float, load: dict, aux_coef: float, z_coef: float) -> float:
    """The cross-entropy of a step whose logged loss is torchtitan's total and whose router losses are `load`'s:
    the loss adds the micro-steps' mean of each, as `load` holds them."""
    return loss - aux_coef * load["aux"] - z_coef * load["z"]


def last_moe(records: list) -> dict | None:
    """The last record with the experts' load; None on a dense model."""
    return next((r for r in reversed(records) if "moe" in r), None)


def moe_summary(records: list) -> dict | None:
    """The last interval's worst-balanced layer (highest max/mean) and the router losses; None on a dense model."""
    last = last_moe(records)
    if last is None:
        return None
    moe = last["moe"]
    worst = max(range(len(moe["layers"])), key=lambda i: moe["layers"][i]["max_mean"] or 0)  # null: none routed
    layer = moe["layers"][worst]
    return {
        "step": last["step"],
        "worst_layer": worst,
        "max_mean": layer["max_mean"],
        "entropy": layer["entropy"],
        "block_padding": moe["block_padding"],
        "aux_loss": moe["aux_loss"],
        "z_loss": moe["z_loss"],
    }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def progress_line(record: dict) -> str:
    """`step k/N  tokens/s  loss  ETA`: what someone watching a long run's log wants to see now and then."""
    step, total = record["step"], record["steps_total"]
    text = f"progress: step {step}/{total}  {record['tokens_per_s']:,.0f} tokens/s  loss {record['loss']:.4f}"
    return text + (f"  ETA {duration((total - step) * record['step_time_s'])}" if record.get("step_time_s") else "")


class ReportLogger(BaseLogger):
    """A torchtitan logger backend that appends each logged step to metrics.jsonl, and logs the progress line:
    at the first logged step, then at most once per `progress_every` seconds (a long run's log is not flooded).
    `router`: a MoE model's RouterWatch (moe/routing.py), whose `last` is the interval's load when `log` runs."""

    def __init__(
        self,
        folder: Path,
        world_size: int,
        log_freq: int,
        steps: int,
        progress_every: float = 60,
        clock=time.monotonic,
        router=None,
    ):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "metrics.jsonl"
        self.path.write_text("")  # this launch's records only; a resumed run starts its own
        self.world_size, self.log_freq, self.steps = world_size, log_freq, steps
        self.last_step = None  # a resumed run's first logged step follows the checkpoint's, not step 0
        self.records = []
        self.progress_every, self.clock, self.progress_at = progress_every, clock, None
        self.validations = []  # metrics.jsonl's validation lines: step, time, validation_loss
        self.router = router

    def _write(self, record: dict, kept: list) -> None:
        kept.append(record)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def log(self, metrics, step):
        if "validation_metrics/loss" in metrics:  # the validator's: the mean loss over the validation set
            record = {"step": step, "time": time.time(), "validation_loss": metrics["validation_metrics/loss"]}
            record.update(_method(metrics, "validation_metrics/dpo/", "dpo"))
            record.update(_method(metrics, "validation_metrics/grpo/", "grpo"))
            self._write(record, self.validations)
            return
        if "loss_metrics/global_avg_loss" not in metrics:
            return
        since = step - self.last_step if self.last_step is not None else (1 if step == 1 else self.log_freq)
        record = record_of(metrics, step, max(1, since), self.world_size, self.log_freq)
        record["steps_total"] = self.steps
        load = self.router.last if self.router is not None else None
        if load is not None:
            record["moe"] = moe_record(load)
            if since == 1:  # else the load's losses are the interval's means, the loss the last step's alone
                record["loss_ce"] = loss_ce(record["loss"], load, self.router.aux_coef, self.router.z_coef)
        record.update(_method(metrics, "dpo/", "dpo"))
        record.update(_method(metrics, "grpo/", "grpo"))
        self.last_step = step
        self._write(record, self.records)
        now = self.clock()
        if self.progress_at is None or now - self.progress_at >= self.progress_every:
            logger.info(progress_line(record))
            self.progress_at = now


class RunReport:
    """The report of one trainer's run, built once the trainer is; `watch` ends it. `flops_per_token` and `peak`
    are what torchtitan's MFU should use (the trainer hands them to its metrics processor); `backend`, on the
    metrics rank, is the logger backend that writes metrics.jsonl."""

    def __init__(self, trainer):
        config = trainer.config
        self.trainer = trainer
        self.folder = Path(config.dump_folder) / FOLDER
        self.launched = config.report.launched_at or launch_time()
        self.shape = shapes.of_model_config(trainer.model_config)
        self.flops_per_token = flops.per_token(self.shape, config.training.seq_len)
        device_name = trainer.metrics_processor.device_memory_monitor.device_name
        self.peak = flops.peak(utils.device_type, device_name, config.neuron.logical_nc_config)
        rank = _get_metrics_rank(
            parallel_dims=trainer.parallel_dims, pp_schedule=config.parallelism.pipeline_parallel_schedule
        )
        self.backend = None
        if _rank() == rank:
            self.backend = ReportLogger(
                self.folder,
                trainer.parallel_dims.world_size,
                config.metrics.log_freq,
                config.training.steps,
                config.report.progress_every_s,
                router=trainer.router_watch,
            )
            # the config as finish.py finished it: what `--dry-run` printed before launch
            (self.folder / "config.json").write_text(json.dumps(trainer.finished_config, indent=2) + "\n")

    @contextlib.contextmanager
    def watch(self):
        """Around `train()`: SIGTERM marks the run stopped and unwinds it; on the way out, write the summary."""
        previous = signal.getsignal(signal.SIGTERM)
        if previous == signal.SIG_DFL:  # a stop handler installed by other code (a graceful save) wins
            signal.signal(signal.SIGTERM, _stop_on_sigterm)
        try:
            yield
        except BaseException as error:
            stopped = _stop["reason"] or (isinstance(error, KeyboardInterrupt) and "SIGINT")
            self.finish("stopped" if stopped else "failed", stopped or f"{type(error).__name__}: {error}")
            raise
        else:
            early = self.trainer.step < self.trainer.config.training.steps
            if _stop["reason"] or early:
                self.finish("stopped", _stop["reason"] or f"training returned at step {self.trainer.step}")
            else:
                self.finish("finished", None)
        finally:
            if previous == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def finish(self, end: str, detail: str | None) -> None:
        if self.backend is None:
            return
        records = self.backend.records
        summary = self.summary(records, end, detail)
        (self.folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if records:
            plot_loss(records, self.folder / "loss.png", validation=self.backend.validations)
            plot_throughput(records, WARMUP_STEPS, self.folder / "throughput.png")
        pairs = [r for r in records if "dpo" in r]
        if pairs:
            plot_preference(pairs, self.folder / "dpo.png", [v for v in self.backend.validations if "dpo" in v])
        last = last_moe(records)
        if last is not None:
            tokens = [layer["tokens"] for layer in last["moe"]["layers"]]
            plot_experts(tokens, last["step"], self.folder / "experts.png")

    def summary(self, records: list, end: str, detail: str | None) -> dict:
        trainer, config = self.trainer, self.trainer.config
        dims = trainer.parallel_dims
        now = time.time()
        steady = [r for r in records if r["step"] > WARMUP_STEPS] or records[1:] or records
        warmup = [r for r in records if r not in steady]
        median = lambda key: statistics.median(r[key] for r in steady) if steady else None  # noqa: E731
        step_s = median("step_time_s")
        warmup_s = sum(r["step_time_s"] for r in warmup)
        first_step_end = records[0]["time"] if records else None
        moe = moe_summary(records)
        return {
            "variant": config.report.variant or None,
            "scale": config.report.scale or None,
            "config": config.report.config or None,
            "model": config.report.model or None,
            "compile": config.compile.enable,
            "device": {
                "kind": utils.device_type,
                "name": trainer.metrics_processor.device_memory_monitor.device_name,
                "count": dims.world_size,
            },
            "processes": dims.world_size,
            "nodes": max(1, dims.world_size // devices.processes_per_node(dims.world_size)),
            "batch": {"local": config.training.local_batch_size, "seq_len": config.training.seq_len},
            "steps": {"done": trainer.step, "planned": config.training.steps},
            "end": end,
            "end_detail": detail,
            "tokens_seen": trainer.ntokens_seen * dims.world_size // dims.non_data_parallel_size,
            "tokens_per_s": median("tokens_per_s"),
            "tokens_per_s_per_device": median("tokens_per_s_per_device"),
            "step_time_s": step_s,
            "steady_state": {"steps": [r["step"] for r in steady], "statistic": "median"},
            "warmup": {
                "steps": [r["step"] for r in warmup],
                "seconds": warmup_s,
                "over_steady_s": warmup_s - step_s * len(warmup) if warmup and step_s else None,
                "note": "the first steps build the graphs; with COMPILE=1 they include compilation",
            },
            "flops": {
                "per_token": trainer.metrics_processor.num_flops_per_token,
                "formula": "6 * active matmul weights + 12 * layers * heads * head_dim * seq_len",
                "active_matmul_params": flops.active_matmul_params(self.shape),
                "tflops_per_device": median("tflops_per_device"),
            },
            "mfu": {
                "pct": median("mfu_pct") if self.peak.flops else None,
                "peak_flops": self.peak.flops,
                "peak_source": self.peak.source,
            },
            "peak_memory_gib": max((r["memory_gib"] for r in records), default=None),
            "launch_to_first_step_s": first_step_end - self.launched if first_step_end else None,
            "first_loss": records[0]["loss"] if records else None,
            "last_loss": records[-1]["loss"] if records else None,
            "validation": validation_summary(self.backend.validations),
            "wall_s": now - self.launched,
            "versions": versions(),
            **({"moe": moe} if moe else {}),  # a dense model: no key
            **({"dpo": dpo[-1]["dpo"]} if (dpo := [r for r in records if "dpo" in r]) else {}),  # the last logged
            **({"grpo": grpo[-1]["grpo"]} if (grpo := [r for r in records if "grpo" in r]) else {}),
            "data": getattr(trainer, "data_read", None) and trainer.data_read.last,  # report/data_read.py
            **({"samples": trainer.sampler.stats()} if getattr(trainer, "sampler", None) else {}),  # samples.py
        }


def validation_summary(validations: list) -> dict | None:
    """First, best (and its step) and last validation loss; None without validation."""
    if not validations:
        return None
    best = min(validations, key=lambda v: v["validation_loss"])
    return {
        "first_loss": validations[0]["validation_loss"],
        "best_loss": best["validation_loss"],
        "best_step": best["step"],
        "last_loss": validations[-1]["validation_loss"],
        "steps": [v["step"] for v in validations],
    }


def _stop_on_sigterm(signum, _frame):
    mark_stopped(signal.Signals(signum).name)
    signal.signal(signum, signal.SIG_IGN)  # a second one must not cut the summary short; `watch` restores it
    raise SystemExit(128 + signum)  # unwinds train(); the summary is written on the way out


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def versions() -> dict:
    found = {}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def launch_time(proc="/proc") -> float:
    """When torchrun above this process started (`--report.launched_at`, which the launcher sets, is earlier).

    From /proc (Linux): each ancestor's start time in clock ticks since boot. Without one, this process's start.
    """
    try:
        boot = next(float(line.split()[1]) for line in open(f"{proc}/stat") if line.startswith("btime"))
        tick = os.sysconf("SC_CLK_TCK")
        pid, earliest = os.getpid(), None
        while pid > 1:
            with open(f"{proc}/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cmdline = open(f"{proc}/{pid}/cmdline", "rb").read().replace(b"\0", b" ")
            started = boot + int(fields[19]) / tick
            if earliest is None or any(word in cmdline for word in (b"torch.distributed.run", b"torchrun")):
                earliest = started
            pid = int(fields[1])
        return earliest
    except (OSError, StopIteration, ValueError, IndexError):
        return time.time() - time.process_time()
