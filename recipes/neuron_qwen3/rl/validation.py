"""VALIDATION under METHOD=grpo: the held-out prompts answered greedily by the rollout's generator (its shapes, its
KV cache) and scored by the run's reward functions, every `--validator.freq` steps and after the last.

The validation figure is the mean total reward over the whole held-out set. torchtitan's validator logs a loss, so
the loss it is given is that mean negated (lower is better, as for every other validation); each reward's mean,
the completions' mean length and truncated share go beside it, and the first few completions with their rewards
to samples.md. Each rank answers every world-th prompt; the generator agrees on the number of waves.
"""

import torch
import torch.distributed as dist

from neuron_qwen3.data import records
from neuron_qwen3.data.loader import table_reader, validation_records
from neuron_qwen3.data.records import DataError
from neuron_qwen3.generate.sampling import Sampling
from neuron_qwen3.interval import IntervalSums
from neuron_qwen3.rl.rollout import reward_stats, reward_sums, scored_rows

SHOWN = 4  # held-out completions written to samples.md at each validation


class HeldOutPrompts:
    """`validate()` runs on every rank."""

    def __init__(self, trainer, rollout):
        config, self.trainer, self.rollout = trainer.config, trainer, rollout
        loader = config.dataloader
        table, indices, found = validation_records(loader, loader.tokenizer_folder)
        if found != "prompt":
            raise DataError(
                f"VALIDATION={loader.validation}: holds {found} records; METHOD=grpo validates on prompt-only "
                "records (a `prompt` field each), answered and scored like the training prompts"
            )
        reader = table_reader(table, records.Order(indices, loader.seed, 0, 1))
        whole = []
        while (item := reader.next()) is not None:
            whole.append((reader.origin(item[0]), item[1]))
        rank = dist.get_rank(rollout.group) if rollout.group is not None else 0
        world = dist.get_world_size(rollout.group) if rollout.group is not None else 1
        self.total = len(whole)
        self.batch = whole[rank::world]
        self.asked = [rollout.prompt_ids(origin, record) for origin, record in self.batch]  # too long: one line now

    def validate(self, step: int) -> tuple[float, dict, list]:
        """(the loss to log, the metrics beside it, the samples rows of the first few completions: rank 0's)."""
        rollout, model = self.rollout, self.trainer.model_parts[0]
        model.eval()
        try:
            answers = rollout.generator.generate([ids for ids, _, _ in self.asked], Sampling())
        finally:
            model.train()
        names = rollout.rewards.names
        per_function, total, rows = torch.empty(0, len(names)), torch.empty(0), []
        if answers:
            per_function, _ = rollout.score(self.batch, self.asked, answers)
            total = rollout.rewards.total(per_function)
            if rollout.writer:  # the rollout's samples rows: its training completions go there too
                shown = answers[:SHOWN]
                asked = self.batch[: len(shown)]
                rows = scored_rows(step, asked, shown, per_function, total, names, rollout.tokenizer.decode)
        figures = IntervalSums(rollout.group, self.trainer.device)
        figures.add(**reward_sums(names, per_function, total))
        figures.add(
            lengths=float(sum(len(a.tokens) for a in answers)),
            truncated=float(sum(a.stop == "length" for a in answers)),
            completions=float(len(answers)),
        )
        sums = figures.reduced()
        found = reward_stats(names, sums, "validation_metrics/grpo/")
        found["validation_metrics/grpo/completions/mean_length"] = sums["lengths"] / sums["completions"]
        found["validation_metrics/grpo/completions/truncated_share"] = sums["truncated"] / sums["completions"]
        reward = found.get("validation_metrics/grpo/reward/mean", float("nan"))
        return -reward, found, rows
