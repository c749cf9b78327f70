"""Generation samples while it trains: at step 0, every SAMPLE_INTERVAL steps (the validation interval by default)
and after the last step, the model in the trainer answers SAMPLE_PROMPTS greedily, and report/samples.jsonl,
samples.md and TensorBoard show the answers.

One shape: every forward pass of sampling is the training window, [local batch, seq_len], the shape validation's
forward already has, so on Neuron sampling compiles no graph of its own, whatever the prompts or the step. The
prompts are packed into it as documents, as training packs them (positions restart, attention stays inside a
document), so one forward pass serves every prompt that fits. There is no KV cache: each new token is one forward
pass of the whole window. Every rank runs the same prompts, since FSDP needs every
rank in each forward; rank 0's picks are broadcast so every rank stops together, and rank 0 writes. The model runs
in eval mode under no_grad, so the MoE layers count no tokens for torchtitan's load balancing and the router watch
records nothing (it records only training micro-steps).
"""

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torchtitan.tools.logging import logger

from neuron_qwen3.data import conversations, records
from neuron_qwen3.data.conversations import Problem
from neuron_qwen3.data.records import DataError
from neuron_qwen3.data.tokens import IM_END, Encoder, chat_template

FOLDER = "report"


@dataclass
class Prompt:
    origin: str  # file:line
    text: str  # the last user turn, as the report shows it
    thinking: bool | None  # enable_thinking for the template; None: its default
    ids: list


CONVERSATION_FIELDS = ("messages", "conversations")  # OpenAI's and ShareGPT's, as DATASET_FIELD names them


def field_of(config) -> str:
    """The field a prompt's conversation is looked for in first: DATASET_FIELD when it names one, else `messages`."""
    return config.dataloader.field if config.dataloader.field != "text" else "messages"


def prompt_field(record: dict, preferred: str) -> str:
    """The field that holds this prompt record's conversation, whichever accepted form the file is in: `preferred`
    (DATASET_FIELD's) when the record has it, else OpenAI's `messages` or ShareGPT's `conversations`; a `prompt`
    record needs none. A prompts file need not be in the training data's form."""
    return next((name for name in (preferred, *CONVERSATION_FIELDS) if name in record), preferred)


def tokenizer_of(config):
    """torchtitan's tokenizer of the folder whose chat template the run renders with (finish.py sets it)."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    return HuggingFaceTokenizer(
        tokenizer_path=getattr(config.dataloader, "tokenizer_folder", "") or config.hf_assets_path
    )


def read_prompts(path: str, field: str, tokenizer, room: int) -> list[Prompt]:
    """Every record of `path` as a prompt to answer: the conversation without trailing assistant turns, rendered
    with the generation prompt; `room`: the most prompt tokens a window leaves. A bad record: DataError, one line
    with its file and line."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    table = records.local_table(path)
    if not len(table):
        raise DataError(f"SAMPLE_PROMPTS={path}: holds no record")
    encoder = Encoder(tokenizer)
    prompts = []
    for i in range(len(table)):
        record = table.record(i)
        try:
            messages, tools = conversations.conversation(record, prompt_field(record, field), answered=False)
            while messages and messages[-1]["role"] == "assistant":
                messages = messages[:-1]
            if not messages or messages[-1]["role"] == "system":
                raise Problem("no user or tool turn to answer")
            thinking = record.get("enable_thinking")
            if thinking is not None and not isinstance(thinking, bool):
                raise Problem(f"enable_thinking is not true or false: {thinking!r}")
            ids = encoder.prompt(messages, tools, thinking)
        except Problem as problem:
            raise DataError(f"{table.origin(i)}: {problem}") from None
        if len(ids) > room:
            raise DataError(
                f"{table.origin(i)}: {len(ids)} prompt tokens; the window leaves {room} beside "
                "SAMPLE_TOKENS: shorten the prompt or lower SAMPLE_TOKENS"
            )
        last = next(m for m in reversed(messages) if m["role"] in ("user", "tool"))
        prompts.append(Prompt(table.origin(i), last.get("content") or "", thinking, ids))
    return prompts


def stop_ids(tokenizer) -> set:
    """The tokens an answer ends at: the template's end of turn, and the tokenizer's end of text."""
    ids = {tokenizer.tokenizer.token_to_id(IM_END)}
    eos = chat_template(tokenizer.tokenizer_path)[1].get("eos_token")
    if eos:
        ids.add(tokenizer.tokenizer.token_to_id(eos))
    return ids - {None}


def layout(prompts: list, rows: int, seq_len: int, new_tokens: int) -> list:
    """Windows of (prompt index, row, start): each prompt and the room for its answer packed first-fit into the rows
    of a [rows, seq_len] window, as training packs documents; a new window when none has room."""
    windows, fill = [], []
    for k, ids in enumerate(prompts):
        size = len(ids) + new_tokens
        assert size <= seq_len, f"prompt {k}: {len(ids)} tokens and {new_tokens} to answer exceed the window"
        row = next((r for r in range(rows) if fill[r] + size <= seq_len), None) if windows else None
        if row is None:
            windows.append([])
            fill, row = [0] * rows, 0
        windows[-1].append((k, row, fill[row]))
        fill[row] += size
    return windows


def generate(
    forward, prompts: list, rows: int, seq_len: int, new_tokens: int, stops: set, agree=lambda picks: picks
) -> list:
    """Greedy answers to `prompts` (lists of ids): (tokens, stop reason) each, stop reason `end` (a token of
    `stops`, kept) or `length`. The prompts are packed as documents (positions restart at 0) into windows
    (`layout`). `forward(tokens, positions, at)` takes a [rows, seq_len] window, attends within its documents as
    training does, and returns the logits at the (row, position) pairs of `at`: always as many pairs (the most
    prompts a window holds, padded), so that every call has the same shapes. A row's filler is id 0: no logit read
    depends on it (causal). `agree` makes the ranks pick alike (a broadcast)."""
    windows = layout(prompts, rows, seq_len, new_tokens)
    reads = max(len(window) for window in windows)
    answers = [None] * len(prompts)
    for window in windows:
        tokens = torch.zeros((rows, seq_len), dtype=torch.long)
        positions = torch.arange(seq_len).repeat(rows, 1)
        ends, outs, row_of = {}, {k: [] for k, _, _ in window}, {k: row for k, row, _ in window}
        for k, row, start in window:
            ids = prompts[k]
            tokens[row, start : start + len(ids)] = torch.tensor(ids)
            positions[row, start : start + len(ids) + new_tokens] = torch.arange(len(ids) + new_tokens)
            ends[k] = start + len(ids)
        for _ in range(new_tokens):
            if not ends:
                break
            live = sorted(ends)
            at = torch.zeros((reads, 2), dtype=torch.long)
            at[: len(live)] = torch.tensor([[row_of[k], ends[k] - 1] for k in live])
            picks = agree(forward(tokens, positions, at)[: len(live)].float().argmax(dim=-1))
            for k, pick in zip(live, picks.tolist()):
                outs[k].append(pick)
                tokens[row_of[k], ends[k]] = pick
                ends[k] += 1
                if pick in stops:
                    del ends[k]
                    answers[k] = (outs[k], "end")
        for k in ends:
            answers[k] = (outs[k], "length")
    return answers


class Sampler:
    """SAMPLE_PROMPTS answered by a trainer's model; `sample(step)` runs on every rank. `prepare`: torchtitan's
    post_dataloading_process (the attention masks from the positions), without the run hooks'."""

    def __init__(self, trainer, prepare):
        config = trainer.config
        if trainer.parallel_dims.pp_enabled or trainer.parallel_dims.cp_enabled:
            raise DataError(
                "SAMPLE_PROMPTS needs one model part and whole windows: not with pipeline or context parallelism"
            )
        self.trainer, self.prepare, self.tokenizer = trainer, prepare, tokenizer_of(config)
        self.prompts = read_prompts(
            config.samples.prompts, field_of(config), self.tokenizer, config.training.seq_len - config.samples.tokens
        )
        self.every = interval(config)
        self.rows, self.seq_len, self.new_tokens = (
            config.training.local_batch_size,
            config.training.seq_len,
            config.samples.tokens,
        )
        self.stops = stop_ids(self.tokenizer)
        self.writer = dist.get_rank() == 0 if dist.is_initialized() else True
        self.folder = Path(config.dump_folder) / FOLDER
        self.shapes, self.forwards, self.seconds, self.last = set(), 0, 0.0, None
        self.tensorboard = None
        if self.writer and config.metrics.enable_tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(Path(config.dump_folder) / config.metrics.save_tb_folder / "samples"))

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def begin(self, step: int) -> None:
        """At the loaded step: a resumed run's samples.jsonl keeps what came before it (not a stopped run's later
        rows, which it samples again); a fresh run's starts empty. Then step 0's answers, if fresh."""
        if self.writer:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / "samples.jsonl"
            kept = [row for row in rows_of(path) if row["step"] <= step] if step else []
            path.write_text("".join(json.dumps(row) + "\n" for row in kept))
        if step == 0:
            self.sample(0)

    def sample(self, step: int) -> None:
        if self.last == step:
            return
        self.last = step
        trainer, started = self.trainer, time.perf_counter()
        model = trainer.model_parts[0]
        model.eval()
        try:
            with torch.no_grad():
                answers = generate(
                    self._forward,
                    [p.ids for p in self.prompts],
                    self.rows,
                    self.seq_len,
                    self.new_tokens,
                    self.stops,
                    agree=self._agree,
                )
        finally:
            model.train()
        self.seconds += time.perf_counter() - started
        if self.writer:
            self._write(step, answers)

    def _forward(self, tokens, positions, at):
        """The model's logits at `at`. With torchtitan's chunked loss the model stops before its lm_head (the loss
        applies it, chunk by chunk): then the head runs here, on the hidden states read."""
        self.shapes.add(tuple(tokens.shape))
        self.forwards += 1
        device, model = self.trainer.device, self.trainer.model_parts[0]
        inputs = {"input": tokens.to(device), "positions": positions.to(device)}
        inputs, _, extra = self.prepare(inputs, torch.zeros_like(inputs["input"]))
        out = model(inputs, **extra)[at[:, 0].to(device), at[:, 1].to(device)]
        return model.lm_head(out) if getattr(model, "_skip_lm_head", False) else out

    def _agree(self, picks):
        if dist.is_initialized() and dist.get_world_size() > 1:
            picks = picks.to(self.trainer.device)
            dist.broadcast(picks, src=0)
        return picks.cpu()

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
        with (self.folder / "samples.jsonl").open("a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        write_markdown(rows_of(self.folder / "samples.jsonl"), self.folder / "samples.md")
        if self.tensorboard is not None:
            for k, row in enumerate(rows):
                self.tensorboard.add_text(f"samples/{k}", f"**{row['text']}**\n\n{row['answer']}", step)
            self.tensorboard.flush()
        logger.info(
            f"samples: step {step}, {len(rows)} answers in {self.seconds:.1f} s so far "
            f"({', '.join(stop for _, stop in answers)})"
        )

    def stats(self) -> dict:
        """For summary.json: the prompts, the window shapes sampling ran (one) and how many forward passes, and
        its seconds in all."""
        return {
            "prompts": len(self.prompts),
            "tokens": self.new_tokens,
            "shapes": sorted(self.shapes),
            "forwards": self.forwards,
            "seconds": round(self.seconds, 3),
        }


def rows_of(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def write_markdown(rows: list, path: Path) -> None:
    """Each prompt's answers step by step, under the loss curve."""
    lines = ["# Samples", "", "![loss](loss.png)", ""]
    for origin in dict.fromkeys(row["prompt"] for row in rows):
        mine = [row for row in rows if row["prompt"] == origin]
        lines += [
            f"## {origin}",
            "",
            "> " + mine[0]["text"].replace("\n", "\n> "),
            "",
            "| step | stop | answer |",
            "|---|---|---|",
        ]
        lines += [f"| {row['step']} | {row['stop']} | {cell(row['answer'])} |" for row in mine]
        lines.append("")
    path.write_text("\n".join(lines))


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>") or " "


def interval(config) -> int:
    """Steps between samples: SAMPLE_INTERVAL, else the validation interval with validation; 0: none between."""
    return config.samples.every or (config.validator.freq if config.validator.enable else 0)


def before_launch(config) -> list:
    """SAMPLE_PROMPTS read and rendered as the workers' sampler reads them, for the pre-launch pass: a bad record,
    or a prompt the window cannot answer in, raises DataError there. Returns the line that says when they are
    answered (none without prompts, or without the section: a user's MODULE may lack it)."""
    settings = getattr(config, "samples", None)
    if settings is None or not settings.prompts:
        return []
    found = read_prompts(
        settings.prompts, field_of(config), tokenizer_of(config), config.training.seq_len - settings.tokens
    )
    every = f", every {interval(config)} steps" if interval(config) else ""
    return [
        f"samples: {len(found)} prompts answered (up to {settings.tokens} tokens) at step 0{every} and after "
        f"the last step, in windows of {config.training.local_batch_size} x {config.training.seq_len}"
    ]
