"""LoRA's counts and memory, for the run's log and `--dry-run`: trainable and frozen parameters, and the bytes each
rank holds, predicted from the shapes (on meta) and measured after the first step."""

from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor
from torchtitan.tools.logging import logger

from neuron_qwen3.lora.adapters import freeze_base, insert
from neuron_qwen3.lora.targets import family_of
from neuron_qwen3.settings import Lora

BYTES_FP32 = 4


@dataclass(frozen=True)
class Footprint:
    """Parameters and the sharded state per rank: fp32 weights (all), fp32 gradients and Adam's two fp32 moments
    (trainable ones only), FSDP over `ranks`; `full` is the same model fine-tuned in full, for comparison."""

    trainable: int
    frozen: int
    ranks: int
    per_rank: dict = field(default_factory=dict)  # weights, gradients, optimizer: bytes
    full: dict = field(default_factory=dict)

    def line(self) -> str:
        size = lambda v: f"{v / 2**30:.2f} GiB" if v >= 2**30 else f"{v / 2**20:.2f} MiB"
        gib = lambda d: ", ".join(f"{k} {size(v)}" for k, v in d.items())
        share = self.trainable / (self.trainable + self.frozen)
        return (
            f"{self.trainable:,} trainable ({100 * share:.3f}%), {self.frozen:,} frozen parameters; per rank over "
            f"{self.ranks}: {gib(self.per_rank)} (full fine-tuning: {gib(self.full)})"
        )


def footprint(model: nn.Module, ranks: int) -> Footprint:
    """Of a model with its adapters in and its base frozen (meta works: only shapes are read)."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())

    def state(train):
        return {
            "weights": BYTES_FP32 * total / ranks,
            "gradients": BYTES_FP32 * train / ranks,
            "optimizer": 2 * BYTES_FP32 * train / ranks,
        }

    return Footprint(trainable, total - trainable, ranks, state(trainable), state(total))


def log_state_bytes(optimizers, model_parts) -> None:
    """Once, after the first optimizer step: the bytes this rank holds (local shards) in parameters, gradients and
    optimizer state, so LoRA's saving is measured, not only predicted (bench/bench_lora.py reads the line)."""
    last = optimizers.optimizers[-1]

    def measure(*_):
        handle.remove()
        params = [p for part in model_parts for p in part.parameters()]
        local = [p.to_local() if isinstance(p, DTensor) else p for p in params]
        grads = [g.to_local() if isinstance(g, DTensor) else g for g in (p.grad for p in params) if g is not None]
        trainable = sum(p.numel() for p in params if p.requires_grad)
        state = [
            value
            for optimizer in optimizers.optimizers
            for per_param in optimizer.state.values()
            for value in per_param.values()
            if isinstance(value, torch.Tensor) and value.dim()
        ]
        mib = lambda tensors: sum(t.numel() * t.element_size() for t in tensors) / 2**20
        logger.info(
            f"state after step 1 on this rank: {trainable:,} trainable parameters; parameters "
            f"{mib(local):.2f} MiB, gradients {mib(grads):.2f} MiB ({len(grads)} tensors), optimizer state "
            f"{mib(state):.2f} MiB"
        )

    handle = last.register_step_post_hook(measure)


def dry_run(config, settings: Lora, ranks: int) -> Footprint:
    """For `--dry-run` (the pre-launch child): the config's model built on meta with the adapters, base frozen."""
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    with torch.device("meta"):
        model = model_config.build()
    insert(model, settings, family_of(model_config))
    freeze_base(model)
    return footprint(model, ranks)
