"""METHOD=grpo's data: each generation, this rank's prompts answered GRPO_GENERATIONS times by the generator (the
model being trained, KV cache, fixed shapes), scored by the reward functions on the host, and laid out as the
micro-batches the step trains on.

A completion is one row of seq_len + 1 tokens, [prompt][completion][pad], its labels IGNORE_INDEX but on the
completion's tokens (its stop token included, as TRL's completion mask; none for a truncated completion under
GRPO_MASK_TRUNCATED), with the row's advantage and the generator's log-probability of each label; the advantages
are the whole generation's, so a group may span micro-batches. The sampler draws from a stream seeded by
(GRPO_SEED, rank, step): a resumed run draws the same completions with no saved state.
"""

import pickle
import time

import numpy as np
import torch
import torch.distributed as dist
from torchtitan.components.dataloader import DataloaderExhaustedError
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.tools.logging import logger

from neuron_qwen3.data.prompts import grpo_prompt
from neuron_qwen3.data.tokens import Encoder
from neuron_qwen3.generate import setup as generator_setup
from neuron_qwen3.generate.engine import Generator
from neuron_qwen3.generate.plan import MOST_BUCKETS, SMALLEST_BUCKET, Plan
from neuron_qwen3.generate.sampling import Sampling
from neuron_qwen3.interval import IntervalSums
from neuron_qwen3.preference.reference import AdaptersOff, Frozen
from neuron_qwen3.rl import rewards as reward_functions
from neuron_qwen3.rl.grpo import GrpoLoss, advantages

SLOTS = 32  # the most completions generated at once; more go in further waves


def grpo_parts(trainer) -> tuple:
    """(the loss, the rollout) of METHOD=grpo on a built trainer; (None, None) under another method. RewardError:
    a reward function that cannot be loaded."""
    config = trainer.config
    if config.preference.method != "grpo":
        return None, None
    dims = trainer.parallel_dims
    assert not (dims.pp_enabled or dims.cp_enabled or dims.tp_enabled), (
        "METHOD=grpo runs on data-parallel (FSDP) ranks: no pipeline, context or tensor parallelism"
    )
    g, model = config.grpo, trainer.model_parts[0]
    group = dims.get_optional_mesh("loss").get_group() if dims.dp_cp_enabled else None
    reference = None
    if g.beta:  # finish.py resolved it: a model folder, or the base with the adapters off
        reference = Frozen(trainer, config.preference.reference) if config.preference.reference else AdaptersOff(model)
    rewards = reward_functions.of_run(config)
    ranks = dims.dp_replicate * dims.dp_shard
    loss = GrpoLoss(model, g, trainer.gradient_accumulation_steps, ranks, reference, group)
    return loss, Rollout(trainer, rewards, group)


def room_of(config) -> int:
    """The most prompt tokens a window leaves beside GRPO_MAX_COMPLETION."""
    return config.training.seq_len - config.grpo.max_completion


def plan_of(config, accumulation: int) -> Plan:
    """The generator's shapes: the step's completions on this rank (the local batch x the trainer's `accumulation`
    micro-steps, up to SLOTS) at once, prompts in up to four power-of-two buckets up to the room GRPO_MAX_COMPLETION
    leaves in the window."""
    room = room_of(config)
    sizes = sorted({min(room, 1 << k) for k in range(SMALLEST_BUCKET.bit_length() - 1, room.bit_length() + 1)})
    per_step = config.training.local_batch_size * accumulation
    return Plan(slots=min(per_step, SLOTS), buckets=tuple(sizes[-MOST_BUCKETS:]), new_tokens=config.grpo.max_completion)


def stream_seed(seed: int, rank: int, step: int) -> int:
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])


class Rollout:
    """`batches(prompts)`: the trainer's data iterator under METHOD=grpo, over the loader's batches of prompts."""

    def __init__(self, trainer, rewards, loss_group=None):
        config = trainer.config
        self.trainer, self.config, self.rewards, self.group = trainer, config.grpo, rewards, loss_group
        self.tokenizer = generator_setup.tokenizer_of(config)
        self.encoder = Encoder(self.tokenizer)
        self.seq_len, self.batch = config.training.seq_len, config.training.local_batch_size
        self.plan = plan_of(config, trainer.gradient_accumulation_steps)
        gather, _, why = generator_setup.gathering(config, self.plan, generator_setup.rank_memory_gib(config))
        stops = generator_setup.stop_ids(self.tokenizer)
        self.generator = Generator(trainer.model_parts[0], self.plan, stops, pad_id=self.pad_id, gather_once=gather)
        for phase, shape in self.plan.shapes():
            logger.info(f"grpo: the generator's {phase} shape {list(shape)}")
        logger.info(f"grpo: {why}")
        self.sampling = Sampling(temperature=self.config.temperature, top_k=self.config.top_k, top_p=self.config.top_p)
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.buffer, self.left = [], 0
        self.sums, self.since = IntervalSums(loss_group, trainer.device), time.perf_counter()
        self.writer = self.rank == 0  # the rank whose completions become samples rows
        self.shown = []  # the last generation's first group with its rewards, for samples.md at the next log

    def take_shown(self) -> list:
        """The samples rows of the generations since the last call (rank 0's; none on the others)."""
        shown, self.shown = self.shown, []
        return shown

    def state_dict(self) -> dict:
        """For the checkpoint (the trainer's train state): the steps left on the last generation and its micro-batches,
        under a key of this rank's own, as torchtitan keeps each rank's data-loader position. With
        GRPO_ITERATIONS above 1 a run resumed between two generations trains on the one it was trained on."""
        on_host = [
            ({**columns, "learner_old": [t.cpu() for t in columns["learner_old"]]}, y) for columns, y in self.buffer
        ]
        return {f"grpo_generation_rank_{self.rank}": pickle.dumps((self.left, on_host))}

    def load_state_dict(self, state_dict: dict) -> None:
        self.left, self.buffer = pickle.loads(state_dict[f"grpo_generation_rank_{self.rank}"])

    @property
    def pad_id(self) -> int:
        return self.tokenizer.eos_id if self.tokenizer.eos_id is not None else 0

    def batches(self, prompts):
        """Micro-batches for the trainer's steps: one generation serves GRPO_ITERATIONS steps."""
        metrics = self.trainer.metrics_processor
        while True:
            loading = 0.0  # reading the prompts, as torchtitan counts a batch's (generating is apart)
            if not self.left:
                began = time.perf_counter()
                try:
                    batch = next(prompts)
                except StopIteration as ex:
                    raise DataloaderExhaustedError() from ex
                loading = time.perf_counter() - began
                self.buffer, self.left = self.generate(batch), self.config.iterations
            self.left -= 1
            for inputs, labels in self.buffer:
                metrics.ntokens_since_last_log += int(inputs["real"].sum())  # the prompt and completion, not the pads
                metrics.data_loading_times.append(loading)
                loading = 0.0
                yield dict(inputs), labels  # a copy: the trainer pops the rollout columns from it

    def prompt_ids(self, origin: str, record: dict) -> tuple:
        """(ids, the prompt as the rewards see it, conversational): `grpo_prompt` in this run's window."""
        return grpo_prompt(origin, record, self.encoder, self.plan.buckets[-1], self.config.max_completion)

    def generate(self, batch: list) -> list:
        """This rank's prompts (`batch`: (origin, record) pairs) answered, scored and laid out in micro-batches."""
        g = self.config.generations
        asked = [self.prompt_ids(origin, record) for origin, record in batch]
        model = self.trainer.model_parts[0]
        rng = torch.Generator().manual_seed(stream_seed(self.config.seed, self.rank, self.trainer.step))
        began = time.perf_counter()
        model.eval()
        try:
            answers = self.generator.generate([ids for ids, _, _ in asked for _ in range(g)], self.sampling, rng)
        finally:
            model.train()
        generating = time.perf_counter() - began
        per_function, seconds = self.score(batch, asked, answers)
        total = self.rewards.total(per_function)
        everyone = self._gathered(total) if self.config.scale_rewards == "batch" else None
        found, zero_std = advantages(total, g, self.config.scale_rewards, everyone)
        self._count(per_function, total, answers, zero_std, generating, sum(seconds.values()))
        if self.writer:
            self.shown = scored_rows(
                self.trainer.step,
                [batch[0]] * g,
                answers[:g],
                per_function,
                total,
                self.rewards.names,
                self.tokenizer.decode,
            )
        rows = [self._row(asked[k // g][0], a) for k, a in enumerate(answers)]
        return [
            self._micro_batch(rows[i : i + self.batch], found[i : i + self.batch])
            for i in range(0, len(rows), self.batch)
        ]

    def score(self, batch: list, asked: list, answers: list) -> tuple:
        """The reward functions on `answers`, each prompt's completions in a row (`asked`: prompt_ids of each of
        `batch`'s records), with the records' other columns: ([N, F] rewards, {name: seconds})."""
        texts = [self.tokenizer.decode(a.tokens, skip_special_tokens=True) for a in answers]
        every = [k * len(asked) // len(answers) for k in range(len(answers))]  # each completion's prompt
        completions = [
            [{"role": "assistant", "content": text}] if asked[p][2] else text for text, p in zip(texts, every)
        ]
        columns = {
            key: [batch[p][1].get(key) for p in every] for key in batch[0][1] if key not in ("prompt", "completion")
        }
        prompts, origins = [asked[p][1] for p in every], [batch[p][0] for p in every]
        return self.rewards.score(prompts, completions, [a.tokens for a in answers], columns, origins)

    def _row(self, ids: list, answer) -> tuple:
        sequence = ids + answer.tokens
        row = torch.full((self.seq_len + 1,), self.pad_id, dtype=torch.long)
        row[: len(sequence)] = torch.tensor(sequence)
        labels = torch.full((self.seq_len,), IGNORE_INDEX, dtype=torch.long)
        old = torch.zeros(self.seq_len, dtype=torch.float32)
        first, end = len(ids) - 1, len(sequence) - 1  # the labels of the completion's tokens: [first, end)
        if not (self.config.mask_truncated and answer.stop == "length"):
            labels[first:end] = row[first + 1 : end + 1]
        old[first:end] = torch.tensor(answer.logprobs, dtype=torch.float32)
        real = torch.arange(self.seq_len) < len(sequence)
        return row[:-1], labels, old, real

    def _micro_batch(self, rows: list, advantages_B: torch.Tensor) -> tuple:
        inputs, labels, old, real = (torch.stack(column) for column in zip(*rows))
        positions = torch.arange(self.seq_len).expand(len(rows), -1).clone()
        columns = {"input": inputs, "positions": positions, "real": real, "advantages": advantages_B, "old": old}
        columns["learner_old"] = []  # GrpoLoss's pi_old, from the first pass on this micro-batch (not moved: a list)
        return columns, labels

    def _gathered(self, total: torch.Tensor) -> torch.Tensor:
        """Every rank's total rewards, for scale_rewards=batch (each rank generates as many)."""
        if self.group is None:
            return total
        device = next(self.trainer.model_parts[0].parameters()).device
        parts = [torch.empty_like(total, device=device) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(parts, total.to(device), group=self.group)
        return torch.cat(parts).cpu()

    def _count(self, per_function, total, answers, zero_std, generating: float, scoring: float) -> None:
        """Sums over the logging interval: each reward's and the total's (sum, sum of squares, count), the
        completions' lengths, the truncated ones, the groups of zero reward std, the seconds generating and
        scoring (the slowest rank's), the longest completion."""
        lengths = [len(a.tokens) for a in answers]
        g = self.config.generations
        self.sums.add(**reward_sums(self.rewards.names, per_function, total))
        self.sums.add(
            lengths=float(sum(lengths)),
            completions=float(len(answers)),
            truncated=float(sum(a.stop == "length" for a in answers)),
            flat_groups=float(zero_std.view(-1, g)[:, 0].sum()),
            groups=float(len(answers) // g),
        )
        self.sums.add(across="max", generate_s=generating, score_s=scoring)
        self.sums.most(longest=float(max(lengths)))

    def interval(self) -> dict:
        """The interval's means over every rank (a collective): rewards (each function's and the total's mean and
        std), completion lengths, the truncated share, the share of groups whose rewards are all equal, and how the
        interval's seconds divide between generating, scoring and the rest, training (the slowest rank's)."""
        if not self.sums:
            return {}
        now = time.perf_counter()
        elapsed, self.since = now - self.since, now
        sums = self.sums.reduced()
        found = reward_stats(self.rewards.names, sums, "grpo/")
        found.update(
            {
                "grpo/completions/mean_length": sums["lengths"] / sums["completions"],
                "grpo/completions/max_length": sums["longest"],
                "grpo/completions/truncated_share": sums["truncated"] / sums["completions"],
                "grpo/frac_reward_zero_std": sums["flat_groups"] / sums["groups"],
                "grpo/time/generate_s": sums["generate_s"],
                "grpo/time/score_s": sums["score_s"],
                "grpo/time/train_s": max(elapsed - sums["generate_s"] - sums["score_s"], 0.0),
            }
        )
        return found


def reward_sums(names: list, per_function: torch.Tensor, total: torch.Tensor) -> dict:
    """Each reward's and the total's sum, sum of squares and count over the completions, leaving out a reward no
    function gave (NaN): what reward_stats reads once every rank's have been added up."""
    found = {}
    columns = [*per_function.T.double(), total.double()]
    for name, column in zip([*(f"rewards/{n}" for n in names), "reward"], columns, strict=True):
        kept = column[~column.isnan()]
        found |= {
            f"{name}/sum": float(kept.sum()),
            f"{name}/squares": float((kept**2).sum()),
            f"{name}/count": float(kept.numel()),
        }
    return found


def scored_rows(step: int, asked: list, answers: list, per_function, total, names: list, decode) -> list:
    """samples.jsonl rows of `answers` with each reward and the total; `asked`: the (origin,
    record) each answer is to. A reward no function gave is null."""
    rows = []
    for k, (answer, (origin, record)) in enumerate(zip(answers, asked, strict=True)):
        shown = {name: float(per_function[k, j]) for j, name in enumerate(names)} | {"total": float(total[k])}
        prompt = record["prompt"]
        rows.append(
            {
                "step": step,
                "prompt": origin,
                "text": prompt if isinstance(prompt, str) else prompt[-1]["content"],
                "enable_thinking": record.get("enable_thinking"),
                "answer": decode(answer.tokens, skip_special_tokens=True),
                "tokens": answer.tokens,
                "stop": answer.stop,
                "rewards": {name: None if value != value else value for name, value in shown.items()},
            }
        )
    return rows


def reward_stats(names: list, sums: dict, prefix: str) -> dict:
    """`{prefix}rewards/<name>/mean` and `/std` for each reward function, `{prefix}reward/...` for the total, from
    reward_sums' figures in `sums`; a reward no completion was given is left out."""
    found = {}
    for name in [*(f"rewards/{n}" for n in names), "reward"]:
        total, squares, count = (sums[f"{name}/{part}"] for part in ("sum", "squares", "count"))
        if count:
            mean = total / count
            found[f"{prefix}{name}/mean"] = mean
            found[f"{prefix}{name}/std"] = max(squares / count - mean**2, 0.0) ** 0.5
    return found
