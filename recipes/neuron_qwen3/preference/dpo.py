"""DPO on packed windows, as TRL's DPOTrainer computes it (sigmoid and IPO losses, rewards, accuracy).

A window holds whole pairs, the chosen then the rejected document (data/pairs.py, packing.py), and each document's
positions restart at 0: the k-th document of a row is found from the positions alone, so pair j of a row is its
documents 2j and 2j + 1, and a pad run (no trained token) is no pair. Every shape is fixed by the window (a row has
at most seq_len / 2 pairs): no data-dependent shape, one graph on Neuron.

The loss is each rank's sum over its pairs divided by the pairs of the whole micro-step over the data-parallel
ranks (and by the accumulation steps), so, like torchtitan's summed cross-entropy, the gradient is the global
batch's mean on 1 or N ranks.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchtitan.components.loss import IGNORE_INDEX

from neuron_qwen3 import settings
from neuron_qwen3.interval import IntervalSums
from neuron_qwen3.preference.logps import head_of, token_logps

LOSSES = settings.choices(settings.Preference, "loss")  # DPO_LOSS's one list: the field's Literal
PER_PAIR = (
    "loss",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
)  # the means over pairs that `interval` gives, with `sft` and `pairs`


def pair_sums(values_BL: torch.Tensor, labels_BL: torch.Tensor, positions_BL: torch.Tensor) -> tuple:
    """(sums, counts), each [B, L/2, 2]: `values` summed over each document's counted tokens, and their number;
    [:, j, 0] is pair j's chosen, [:, j, 1] its rejected."""
    B, L = labels_BL.shape
    assert L % 2 == 0, f"DPO needs an even seq_len, not {L}"
    document = torch.cumsum((positions_BL == 0).long(), dim=1) - 1
    counted = (labels_BL != IGNORE_INDEX).float()
    sums = torch.zeros(B, L, dtype=torch.float32, device=values_BL.device).scatter_add(1, document, values_BL * counted)
    counts = torch.zeros(B, L, dtype=torch.float32, device=values_BL.device).scatter_add(1, document, counted)
    return sums.view(B, L // 2, 2), counts.view(B, L // 2, 2)


def pair_losses(policy, reference, counts, beta: float, kind: str) -> tuple:
    """(per-pair loss, chosen rewards, rejected rewards), each [B, P], from the policy's and the reference's
    sequence log-probabilities ([B, P, 2])."""
    ratios = policy - reference  # log pi/pi_ref of the chosen and the rejected
    if kind == "sigmoid":
        losses = -F.logsigmoid(beta * (ratios[..., 0] - ratios[..., 1]))
    elif kind == "ipo":  # TRL's: each side's ratio averaged over its completion tokens
        mean = ratios / counts.clamp_min(1)
        losses = (mean[..., 0] - mean[..., 1] - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"DPO loss {kind!r} is not one of {', '.join(LOSSES)}")
    rewards = beta * ratios.detach()
    return losses, rewards[..., 0], rewards[..., 1]


class Dpo:
    """The trainer's loss function under METHOD=dpo; `reference_pass` first gives it the micro-step's reference
    log-probabilities. `sums`: the logging interval's sums over its pairs (on the device until `interval`)."""

    def __init__(self, model, reference, beta: float, kind: str, sft_weight: float, accumulation: int, group=None):
        assert kind in LOSSES, f"DPO loss {kind!r} is not one of {', '.join(LOSSES)}"
        self.model, self.reference, self.beta, self.kind = model, reference, beta, kind
        self.sft_weight = sft_weight
        self.accumulation, self.group = accumulation, group
        self.reference_sums = self.positions = None
        self.sums = IntervalSums(group)

    def reference_pass(self, inputs, labels, extra: dict, records=None) -> None:
        """Before the micro-step's forward: the reference's sums (`records`: each token's record, for a reference
        computed before training), and the positions (which torchtitan's validator does not hand its loss_fn)."""
        self.positions = extra["positions"]
        with torch.no_grad():
            self.reference_sums = self.reference.sums(inputs, labels, extra, records)

    def __call__(self, pred, labels, *_, **__):
        assert self.reference_sums is not None, "DPO: no reference pass before this loss"
        policy, counts = pair_sums(token_logps(pred, labels, head=head_of(self.model))[0], labels, self.positions)
        reference, self.reference_sums = self.reference_sums, None
        losses, chosen, rejected = pair_losses(policy, reference, counts, self.beta, self.kind)
        present = ((counts > 0).all(dim=-1)).float()
        pairs, chosen_tokens = present.sum(), (counts[..., 0] * present).sum()
        everywhere = torch.stack([pairs, chosen_tokens]).detach()
        if self.group is not None:
            dist.all_reduce(everywhere, group=self.group)
        # the SFT term (TRL's "sft" loss beside "sigmoid", RPO): the chosen completions' mean token NLL
        sft = -(policy[..., 0] * present).sum() / everywhere[1].clamp_min(1)
        loss = ((losses * present).sum() / everywhere[0].clamp_min(1) + self.sft_weight * sft) / self.accumulation
        logps = policy.detach()
        per_pair = (
            losses.detach(),
            chosen,
            rejected,
            (chosen > rejected).float(),
            chosen - rejected,
            logps[..., 0],
            logps[..., 1],
        )
        self.sums.add(**{name: (value * present).sum() for name, value in zip(PER_PAIR, per_pair, strict=True)})
        self.sums.add(chosen_tokens=chosen_tokens.detach(), pairs=pairs.detach())
        return loss, None

    def interval(self) -> dict | None:
        """The means over every pair since the last call, over every rank (collective), and `sft`: the chosen
        completions' mean token NLL; None: no pair."""
        if not self.sums:
            return None
        sums = self.sums.reduced()
        pairs = sums["pairs"]
        if not pairs:
            return None
        return {
            **{f"dpo/{name}": sums[name] / pairs for name in PER_PAIR},
            "dpo/sft": -sums["logps/chosen"] / sums["chosen_tokens"],
            "dpo/pairs": pairs,
        }
