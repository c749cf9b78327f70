"""GRPO's arithmetic, as TRL 1.16's GRPOTrainer computes it: group-normalised advantages, and the clipped policy
loss on the completions' tokens with an optional KL penalty to a reference.

With r the ratio pi / pi_old of a completion token and A its completion's advantage, a token's loss is
-min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A) + beta r KL, KL = exp(ref - logp) - (ref - logp) - 1 (the k3
estimator, weighted by the ratio as TRL's default use_bias_correction_kl does). pi_old is the training model's
log-probability before the generation's first update, as TRL's: the first pass's own pi detached (r = 1; no update
precedes it), kept for GRPO_ITERATIONS' later passes. Not the generator's: on a device its kernels and precision
differ from training's, and r would start away from 1.

The token losses are averaged as GRPO_LOSS says. torchtitan sums each micro-step's loss over the accumulation
steps and the data-parallel ranks' gradients, where TRL averages both (accelerate, DDP), so each average below is
divided by accumulation x ranks, except dapo, whose divisor is the whole step's completion tokens (torchtitan's
`global_valid_tokens`, TRL's `num_items_in_batch`): the gradient is TRL's on 1 or N ranks.
"""

import torch
from torchtitan.components.loss import IGNORE_INDEX

from neuron_qwen3 import settings
from neuron_qwen3.interval import IntervalSums
from neuron_qwen3.preference.logps import head_of, token_logps

LOSSES = settings.choices(settings.Grpo, "loss")
SCALES = settings.choices(settings.Grpo, "scale_rewards")


def nanstd(values: torch.Tensor, dim=None) -> torch.Tensor:
    """The sample standard deviation (Bessel's correction) over the non-NaN entries, as TRL's `nanstd`."""
    mean = torch.nanmean(values, dim=dim, keepdim=True)
    variance = torch.nanmean((values - mean) ** 2, dim=dim, keepdim=True)
    count = (~values.isnan()).sum(dim=dim, keepdim=True)
    variance = variance * count / (count - 1)
    return variance.sqrt().squeeze() if dim is None else variance.sqrt().squeeze(dim)


def advantages(rewards: torch.Tensor, generations: int, scale: str, everyone: torch.Tensor | None = None):
    """(advantages [N], zero_std [N]) of the total rewards [N], whole groups of `generations` in order: the reward less
    its group's mean, divided by the group's std (scale "group"), the batch's ("batch": `everyone`, every rank's
    rewards, when given) or nothing ("none"), plus 1e-4. A NaN reward (every function gave None) has advantage 0."""
    assert scale in SCALES, f"scale_rewards {scale!r} is not one of {', '.join(SCALES)}"
    grouped = rewards.view(-1, generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(generations)
    if scale == "batch":
        batch = rewards if everyone is None else everyone
        std = nanstd(batch).reshape(()).expand_as(rewards)
    else:
        std = nanstd(grouped, dim=1).repeat_interleave(generations)
    found = rewards - mean
    if scale != "none":
        found = found / (std + 1e-4)
    return torch.nan_to_num(found, nan=0.0), torch.isclose(std, torch.zeros_like(std))


def token_losses(logps, old, reference, advantages_B, epsilon_low, epsilon_high, beta) -> tuple:
    """(per-token loss [B, L], ratio [B, L], r x KL [B, L] or None): TRL's clipped surrogate plus beta r KL."""
    ratio = torch.exp(logps - old)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    adv = advantages_B.unsqueeze(1)
    losses = -torch.min(ratio * adv, clipped * adv)
    kl = None
    if beta:
        kl = (torch.exp(reference - logps) - (reference - logps) - 1) * ratio  # TRL's use_bias_correction_kl
        losses = losses + beta * kl
    return losses, ratio, kl


def reduce(losses, mask, kind: str, max_completion: int, global_tokens, accumulation: int, ranks: int):
    """The micro-step's loss from its token losses [B, L] and mask (1 on a completion token that counts)."""
    total = (losses * mask).sum()
    if kind == "dapo":
        return total / global_tokens.clamp_min(1)
    if kind == "grpo":
        per_completion = (losses * mask).sum(-1) / mask.sum(-1).clamp_min(1)
        found = per_completion.mean()
    elif kind == "bnpo":
        found = total / mask.sum().clamp_min(1)
    elif kind == "dr_grpo":
        found = total / (losses.shape[0] * max_completion)
    else:
        raise ValueError(f"GRPO_LOSS={kind!r} is not one of {', '.join(LOSSES)}")
    return found / (accumulation * ranks)


METRICS = (
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "kl",
    "sampling/logp_difference/mean",
)


class GrpoLoss:
    """The trainer's loss under METHOD=grpo. `prepare` takes a micro-step's rollout columns (advantages, the
    generator's log-probabilities, the reference's) before its forward; `__call__` is the loss; `interval` the
    token means over the logging interval, every rank's (a collective)."""

    def __init__(self, model, config: settings.Grpo, accumulation: int, ranks: int, reference=None, group=None):
        assert config.loss in LOSSES, f"GRPO_LOSS {config.loss!r} is not one of {', '.join(LOSSES)}"
        assert reference is not None or not config.beta, "GRPO_BETA above 0 needs a reference model"
        self.model, self.config, self.reference = model, config, reference
        self.accumulation, self.ranks, self.group = accumulation, ranks, group
        self.columns = None
        self.sums = IntervalSums(group)  # the interval's token sums and the widest sampling difference

    def prepare(self, inputs, labels, extra: dict, columns: dict) -> None:
        """The micro-step's rollout columns (advantages, the generator's log-probabilities `old`, and `learner_old`:
        a list the first pass fills with pi_old for the later ones), and with beta > 0 the reference's
        log-probabilities of its tokens."""
        if self.config.beta:
            with torch.no_grad():
                columns["reference"] = self.reference.logps(inputs, labels, extra, self.config.temperature)
        self.columns = columns

    def __call__(self, pred, labels, global_valid_tokens, *_, **__):
        assert self.columns is not None, "GRPO: no rollout columns before this loss"
        columns, self.columns = self.columns, None
        c = self.config
        logps, entropy = token_logps(pred, labels, c.temperature, head_of(self.model), entropy=True)
        mask = (labels != IGNORE_INDEX).float()
        generated = columns["old"].to(logps.device)  # the generator's log-probabilities of these tokens
        kept = columns.get("learner_old")
        old = kept[0].to(logps.device) if kept else logps.detach()
        if kept is not None and not kept and c.iterations > 1:  # the generation's first pass: later passes use it
            kept.append(old)
        reference = columns.get("reference")
        epsilon_high = c.epsilon if c.epsilon_high is None else c.epsilon_high
        advantages_B = columns["advantages"].to(logps.device)
        losses, ratio, kl = token_losses(logps, old, reference, advantages_B, c.epsilon, epsilon_high, c.beta)
        loss = reduce(losses, mask, c.loss, c.max_completion, global_valid_tokens, self.accumulation, self.ranks)
        with torch.no_grad():
            adv = advantages_B.unsqueeze(1)
            low = (ratio < 1 - c.epsilon) & (adv < 0)
            high = (ratio > 1 + epsilon_high) & (adv > 0)
            gap = (logps.detach() - generated).abs() * mask  # the sampler against the learner, as TRL's vLLM check
            per_token = {
                "entropy": entropy,
                "clip_ratio/low_mean": low.float(),
                "clip_ratio/high_mean": high.float(),
                "clip_ratio/region_mean": (low | high).float(),
                "kl": kl if kl is not None else 0 * entropy,
            }
            self.sums.add(**{name: (value * mask).sum() for name, value in per_token.items()})
            self.sums.add(**{"sampling/logp_difference/mean": gap.sum(), "tokens": mask.sum()})
            self.sums.most(widest=gap.max())
        return loss, None

    def interval(self) -> dict:
        """Token means since the last call, over every rank; KL only with a reference. The sampling difference is
        |log pi - the generator's log-probability| of each token: 0 up to float error before the first update of a
        generation, as the sampler and the learner are the same modules."""
        if not self.sums:
            return {}
        sums = self.sums.reduced()
        found = {f"grpo/{name}": sums[name] / max(sums["tokens"], 1) for name in METRICS}
        found["grpo/sampling/logp_difference/max"] = sums["widest"]
        if not self.config.beta:
            del found["grpo/kl"]
        return found
