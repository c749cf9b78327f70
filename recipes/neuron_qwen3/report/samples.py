"""Generation samples while it trains: at step 0, every SAMPLE_INTERVAL steps (the validation interval by default)
and after the last step, the model in the trainer answers SAMPLE_PROMPTS greedily, and report/samples.jsonl,
samples.md and TensorBoard show the answers.

The answers come from the generator (generate/): the trained model itself with a KV cache, at the shapes its plan
fixes before the run (one prefill per prompt-length bucket, one decode step), so on Neuron sampling compiles a
handful of graphs once, whatever the step. Every rank answers the same prompts (FSDP needs every rank in each
forward) and rank 0 writes. The model runs in eval mode under no_grad, so the MoE layers count no tokens for
torchtitan's load balancing and the router watch records nothing (it records only training micro-steps).
"""

import json
import time
from pathlib import Path

import torch.distributed as dist
from torchtitan.tools.logging import logger

from neuron_qwen3 import shapes
from neuron_qwen3.data.records import DataError
from neuron_qwen3.generate.engine import Generator
from neuron_qwen3.generate.plan import Plan, buckets_for
from neuron_qwen3.generate.sampling import Sampling
from neuron_qwen3.data.prompts import Prompt, field_of, read_prompts
from neuron_qwen3.generate.setup import gathering, itemsize_of, rank_memory_gib, stop_ids, tokenizer_of

FOLDER = "report"
SLOTS = 8  # the most prompts answered at once; more go in further waves
GENERATOR_SHARE = 0.1  # of a rank's device memory, what the KV cache may take beside training's state


class Sampler:
    """SAMPLE_PROMPTS answered by a trainer's model; `sample(step)` runs on every rank."""

    def __init__(self, trainer):
        config = trainer.config
        if trainer.parallel_dims.pp_enabled or trainer.parallel_dims.cp_enabled:
            raise DataError(
                "SAMPLE_PROMPTS needs one model part and whole sequences: not with pipeline or context parallelism"
            )
        self.trainer, self.tokenizer = trainer, tokenizer_of(config)
        self.prompts = prompts_of(config, self.tokenizer)
        self.every = interval(config)
        self.plan = plan_of(config, self.prompts)
        gather, _, why = gathering(config, self.plan, rank_memory_gib(config))
        self.generator = Generator(trainer.model_parts[0], self.plan, stop_ids(self.tokenizer), gather_once=gather)
        for phase, shape in self.plan.shapes():
            logger.info(f"samples: the generator's {phase} shape {list(shape)}")
        logger.info(f"samples: {why}")
        self.writer = writes()
        self.folder = folder_of(config)
        self.seconds, self.last = 0.0, None
        self.tensorboard = None
        if self.writer and config.metrics.enable_tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(Path(config.dump_folder) / config.metrics.save_tb_folder / "samples"))

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def begin(self, step: int) -> None:
        """At the loaded step: samples.jsonl restarted there (restart_rows), then step 0's answers, if fresh."""
        if self.writer:
            restart_rows(self.folder, step)
        if step == 0:
            self.sample(0)

    def sample(self, step: int) -> None:
        if self.last == step:
            return
        self.last = step
        started, model = time.perf_counter(), self.trainer.model_parts[0]
        model.eval()
        try:
            answers = self.generator.generate([p.ids for p in self.prompts], Sampling())
        finally:
            model.train()
        seconds = time.perf_counter() - started
        self.seconds += seconds
        # torchtitan times a logged interval from its last log, so the round would count as the next steps' time
        # (their step time, tokens/s and MFU): moved out of it, as torchtitan's validation is.
        self.trainer.metrics_processor.time_last_log += seconds
        if self.writer:
            self._write(step, [(answer.tokens, answer.stop) for answer in answers])

    def _write(self, step: int, answers: list) -> None:
        decode = self.tokenizer.decode
        rows = [
            {
                "step": step,
                "prompt": p.origin,
                "text": p.text,
                "enable_thinking": p.thinking,
                "answer": decode(tokens),
                "tokens": tokens,
                "stop": stop,
            }
            for p, (tokens, stop) in zip(self.prompts, answers)
        ]
        append_rows(self.folder, rows)
        if self.tensorboard is not None:
            for k, row in enumerate(rows):
                self.tensorboard.add_text(f"samples/{k}", f"**{row['text']}**\n\n{row['answer']}", step)
            self.tensorboard.flush()
        logger.info(
            f"samples: step {step}, {len(rows)} answers in {self.seconds:.1f} s so far "
            f"({', '.join(stop for _, stop in answers)})"
        )

    def stats(self) -> dict:
        """For summary.json: the prompts, the shapes the generator ran and how many forward passes of each, and its
        seconds in all."""
        return {
            "prompts": len(self.prompts),
            "tokens": self.plan.new_tokens,
            "shapes": [[phase, list(shape)] for phase, shape in self.plan.shapes()],
            "forwards": [[phase, list(shape), n] for (phase, shape), n in sorted(self.generator.forwards.items())],
            "seconds": round(self.seconds, 3),
        }


def folder_of(config) -> Path:
    return Path(config.dump_folder) / FOLDER


def writes() -> bool:
    """Whether this process writes the samples files: rank 0, or a run without a process group."""
    return not dist.is_initialized() or dist.get_rank() == 0


def restart_rows(folder: Path, step: int) -> None:
    """At a run's loaded step: a resumed run's samples.jsonl keeps what came before it (not a stopped run's later
    rows, which it writes again); a fresh run's starts empty."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "samples.jsonl"
    kept = [row for row in rows_of(path) if row["step"] <= step] if step else []
    path.write_text("".join(json.dumps(row) + "\n" for row in kept))


def append_rows(folder: Path, rows: list) -> None:
    """`rows` added to samples.jsonl, and samples.md written again from all of it."""
    with (folder / "samples.jsonl").open("a") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    write_markdown(rows_of(folder / "samples.jsonl"), folder / "samples.md")


def rows_of(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def write_markdown(rows: list, path: Path) -> None:
    """Each prompt's answers step by step, under the loss curve; a GRPO held-out prompt's with their rewards."""
    lines = ["# Samples", "", "![loss](loss.png)", ""]
    for origin in dict.fromkeys(row["prompt"] for row in rows):
        mine = [row for row in rows if row["prompt"] == origin]
        scored = any("rewards" in row for row in mine)
        lines += [
            f"## {origin}",
            "",
            "> " + mine[0]["text"].replace("\n", "\n> "),
            "",
            "| step | stop | answer |" + " rewards |" * scored,
            "|---|---|---|" + "---|" * scored,
        ]
        for row in mine:
            rewards = row.get("rewards", {}).items()
            shown = ", ".join(f"{name} {value:g}" for name, value in rewards if value is not None)
            lines.append(f"| {row['step']} | {row['stop']} | {cell(row['answer'])} |" + f" {cell(shown)} |" * scored)
        lines.append("")
    path.write_text("\n".join(lines))


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>") or " "


def interval(config) -> int:
    """Steps between samples: SAMPLE_INTERVAL, else the validation interval with validation; 0: none between."""
    return config.samples.every or (config.validator.freq if config.validator.enable else 0)


def room(config) -> int:
    """The most prompt tokens the training window leaves beside SAMPLE_TOKENS."""
    return config.training.seq_len - config.samples.tokens


def prompts_of(config, tokenizer) -> list[Prompt]:
    return read_prompts(config.samples.prompts, field_of(config), tokenizer, room(config))


def plan_of(config, prompts: list) -> Plan:
    """The generator's shapes for these prompts: up to SLOTS at once, buckets from their lengths."""
    lengths = [len(p.ids) for p in prompts]
    return Plan(
        slots=min(len(prompts), SLOTS), buckets=buckets_for(lengths, room(config)), new_tokens=config.samples.tokens
    )


def before_launch(config) -> list:
    """SAMPLE_PROMPTS read and rendered as the workers' sampler reads them, for the pre-launch pass: a bad record,
    or a prompt the window cannot answer in, raises DataError there. Returns the line that says when they are
    answered and the generator's shapes (none without prompts, or without the section: a user's MODULE may lack
    it)."""
    settings = getattr(config, "samples", None)
    if settings is None or not settings.prompts:
        return []
    found = prompts_of(config, tokenizer_of(config))
    every = f", every {interval(config)} steps" if interval(config) else ""
    plan = plan_of(config, found)
    shape, lines = shapes.of_run(config), []
    if shape is None:  # v5 before its config.json is fetched: the cache's size is not known yet
        cache = f"{plan.length} positions"
    else:
        gib = plan.cache_bytes(shape.n_layers, shape.n_kv_heads, shape.head_dim, itemsize_of(config)) / 2**30
        cache = f"{plan.length} positions, {gib * 1024:.1f} MiB"
        memory = None if config.device == "cuda" else rank_memory_gib(config)  # CUDA's is read in the workers
        if memory is not None and gib > GENERATOR_SHARE * memory:
            raise DataError(
                f"SAMPLE_PROMPTS: the generator's KV cache ({plan.slots} slots x {plan.length} positions) takes "
                f"{gib:.2f} GiB, over {GENERATOR_SHARE:.0%} of the {memory} GiB of a rank: fewer or shorter prompts, "
                "or a lower SAMPLE_TOKENS"
            )
        if config.device != "cuda":
            lines.append(f"samples: {gathering(config, plan, memory)[2]}")
    return [
        f"samples: {len(found)} prompts answered (up to {settings.tokens} tokens) at step 0{every} and after "
        f"the last step; generator: {plan.slots} slots, prefill buckets {', '.join(map(str, plan.buckets))}, "
        f"decode [{plan.slots}, 1], KV cache {cache}",
        *lines,
    ]
