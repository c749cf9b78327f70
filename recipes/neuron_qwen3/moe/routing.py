"""Qwen3-MoE's router losses and the experts' load, on torchtitan's MoE layers (every variant's MoE model).

The load-balancing loss is transformers' `load_balancing_loss_func` (models/qwen3_moe, 5.16: one softmax of
the router logits, top-k of it), pooled over every MoE layer as transformers pools it:

    aux = E * sum_e f_e * P_e,   f_e = (top-k picks of e) / R,   P_e = (sum of softmax probs of e) / R

over the R router rows of all layers, and the ST-MoE z-loss z = (sum over the rows of logsumexp(logits)^2) / R.
Rows are the tokens that count: a window's padding and the blank windows at an epoch's end are left out (the
data marks them), as transformers leaves out what its attention mask does. f, R and the counts are summed over
the data-parallel ranks before each rank adds its own share of P (the loss is linear in P), so the loss, like
torchtitan's summed cross-entropy, is the global batch's on 1 or N ranks; with gradient accumulation, the mean
over the micro-steps. Full activation checkpointing runs each layer's forward again in the backward: the hooks
record only between the model's forward and its loss (`capturing`).
"""

import math

import torch
import torch.distributed as dist
from torchtitan.models.common.moe import MoE

from neuron_qwen3.interval import IntervalSums
from neuron_qwen3.moe.experts import NKIGroupedExperts

QWEN3_MOE_AUX = 0.001  # Qwen3-MoE's config.json router_aux_loss_coef


def moe_layers(model) -> list:
    return [module for module in model.modules() if isinstance(module, MoE)]


class RouterWatch:
    """The router's logits and picks in every MoE layer of `model`, for the losses and the experts' load."""

    def __init__(self, model, aux: float, z: float, accumulation: int, group=None):
        self.layers = moe_layers(model)
        self.aux_coef, self.z_coef, self.accumulation, self.group = aux, z, accumulation, group
        self.num_experts = self.layers[0].router.num_experts if self.layers else 0
        self.capturing, self.real, self.logits, self.picks = False, None, {}, {}
        self.sums = IntervalSums(group)  # the interval's load, losses and kernel rows, on the device until logged
        self.last = None  # the last logged interval's load (`interval`), which the run report reads
        for i, layer in enumerate(self.layers):
            layer.router.gate.register_forward_hook(self._record(self.logits, i, lambda out: out))
            layer.router.register_forward_hook(self._record(self.picks, i, lambda out: out[1]))  # topk ids
            inner = getattr(layer.routed_experts, "inner_experts", None)
            if isinstance(inner, NKIGroupedExperts):
                inner.register_forward_hook(self._blocks)
        self.kernel = None  # rows routed, rows the NKI experts computed in blocks, this micro-step

    def _record(self, into: dict, i: int, pick):
        def hook(_module, _inputs, output):
            if self.capturing:
                into[i] = pick(output)

        return hook

    def _blocks(self, experts, inputs, _output):
        if self.capturing:  # shapes only: no host sync
            found = torch.tensor([float(inputs[0].shape[0]), float(experts.block_rows)], dtype=torch.float64)
            self.kernel = found if self.kernel is None else self.kernel + found

    def start(self, real_BL: torch.Tensor | None) -> None:
        """Before a training micro-step's forward: which of its tokens count (None: all)."""
        self.capturing, self.real, self.kernel = True, real_BL, None
        self.logits.clear(), self.picks.clear()

    def loss(self) -> torch.Tensor:
        """After the forward: this rank's share of the micro-step's weighted router losses; the load recorded.
        No host sync: the sums stay on the device until `interval`."""
        self.capturing = False
        if not self.layers or len(self.logits) != len(self.layers):
            return torch.zeros(())
        device = self.logits[0].device
        real = None if self.real is None else self.real.to(device).reshape(-1).bool()
        counts, probs, z_sums, entropies = [], [], [], []
        for i in range(len(self.layers)):
            logits = self.logits[i].float().reshape(-1, self.num_experts)
            picks = self.picks[i].reshape(logits.shape[0], -1)
            weight = torch.ones(logits.shape[0], device=device) if real is None else real.float()
            p = torch.softmax(logits, dim=-1) * weight[:, None]
            one_hot = torch.zeros_like(logits).scatter_add_(1, picks, weight[:, None].expand_as(picks).contiguous())
            counts.append(one_hot.sum(dim=0))
            probs.append(p.sum(dim=0))
            z_sums.append((torch.logsumexp(logits, dim=-1).square() * weight).sum())
            entropies.append(-(p * torch.log(torch.softmax(logits, dim=-1).clamp_min(1e-30))).sum())
        counts_LE, rows_here = torch.stack(counts).detach(), weight.sum().detach()
        totals = torch.cat([counts_LE.reshape(-1), torch.stack(entropies).detach(), rows_here[None]])
        if self.group is not None:
            dist.all_reduce(totals, group=self.group)
        counts_E = totals[: counts_LE.numel()].reshape(counts_LE.shape).sum(dim=0)
        rows = (totals[-1] * len(self.layers)).clamp_min(1)  # every layer routes the same tokens
        aux = self.num_experts * ((counts_E / rows) * torch.stack(probs).sum(dim=0)).sum() / rows
        z = torch.stack(z_sums).sum() / rows
        kernel = self.kernel if self.kernel is not None else totals.new_zeros(2)
        self.sums.add(  # already the group's, by the all-reduce above
            across="kept",
            counts=totals[: counts_LE.numel()],
            entropy=totals[counts_LE.numel() : -1],
            rows=totals[-1],
            micro_steps=1,
        )
        # each rank's share of the global aux and z (the loss is linear in P); the kernel rows: its own
        self.sums.add(aux=aux.detach(), z=z.detach(), routed=kernel[0].to(device), computed=kernel[1].to(device))
        return (self.aux_coef * aux + self.z_coef * z) / self.accumulation

    def interval(self) -> dict | None:
        """The experts' load since the last call, over every rank: per layer the tokens per expert, max/mean and
        the mean router entropy (nats); the aux and z losses (means over the micro-steps); the share of the NKI
        experts' block rows that are padding (None without them). Collective; None when nothing was routed. Kept
        as `last`, for the run report."""
        if not self.sums:
            self.last = None
            return None
        sums = self.sums.reduced()
        counts = sums["counts"].reshape(len(self.layers), self.num_experts)
        entropy, rows, steps = sums["entropy"], sums["rows"], sums["micro_steps"]
        layers = [
            {
                "tokens": [int(round(c)) for c in row.tolist()],
                "max_mean": float(row.max() / row.mean()) if row.sum() > 0 else math.nan,
                "entropy": float(h / rows) if rows else math.nan,
            }
            for row, h in zip(counts, entropy.tolist())
        ]
        self.last = {
            "layers": layers,
            "aux": sums["aux"] / steps,
            "z": sums["z"] / steps,
            "padding": 1 - sums["routed"] / sums["computed"] if sums["computed"] else None,
        }
        return self.last


def metrics(load: dict) -> dict:
    """The interval's load as scalars, for torchtitan's loggers (TensorBoard, W&B) and metrics.jsonl."""
    found = {"moe/aux_loss": load["aux"], "moe/z_loss": load["z"]}
    if load["padding"] is not None:
        found["moe/block_padding"] = load["padding"]
    for i, layer in enumerate(load["layers"]):
        found[f"moe/layer{i}/max_mean"], found[f"moe/layer{i}/entropy"] = layer["max_mean"], layer["entropy"]
    return found


def freeze(model) -> None:
    """MOE_ROUTER=freeze: every router's weights out of the optimizer (no gradient), as INIT_FROM loaded them."""
    for layer in moe_layers(model):
        for param in layer.router.parameters():
            param.requires_grad_(False)


def wrap_parallelize(parallelize_fn):
    """The model spec's parallelize function, then the routers frozen (on the parallelized parameters)."""

    def parallelize(model, *args, **kwargs):
        model = parallelize_fn(model, *args, **kwargs)
        freeze(model)
        return model

    return parallelize
