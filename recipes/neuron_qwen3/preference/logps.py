"""The labels' log-probabilities under a model, DPO's and GRPO's (and their references'), a chunk of positions at a
time.

A whole window's float32 log-softmax over Qwen3's 151,936 tokens is 2.3 GiB a row of 4,096 positions, and with
gradients the backward would keep it beside the logits. Here each chunk's logits (the lm_head applied, when the
model stops before it) and log-softmax are made and dropped; with gradients they are recomputed in the backward
(activation checkpointing, as torchtitan's chunked cross-entropy keeps one chunk's logits), so one chunk's exist
at a time. The values are the whole window's: each position's softmax is its own.
"""

import torch
from torch.utils.checkpoint import checkpoint
from torchtitan.components.loss import IGNORE_INDEX

TOKENS = 512  # a chunk's rows x positions: [512, V] float32 is 0.29 GiB at Qwen3's vocabulary


def head_of(model):
    """The lm_head to apply to the model's output: torchtitan's models stop before it under its chunked loss (the
    trainer sets `_skip_lm_head`); None where the output is the logits (transformers' models, v5)."""
    return model.lm_head if getattr(model, "_skip_lm_head", False) else None


def token_logps(out, labels_BL, temperature: float = 1.0, head=None, entropy: bool = False, tokens: int = TOKENS):
    """(log p(label) [B, L] in float32 at `temperature`, 0 where the label does not count; with `entropy`, each
    position's entropy [B, L], detached, else None), from `out`: the logits, or the hidden states `head` maps to
    them; a chunk of about `tokens` rows x positions at a time."""
    B, L = labels_BL.shape
    positions = max(1, tokens // B)
    picked, entropies = [], []
    for start in range(0, L, positions):
        piece = (out[:, start : start + positions], labels_BL[:, start : start + positions])
        if torch.is_grad_enabled() and out.requires_grad:
            found = checkpoint(_chunk, *piece, temperature, head, entropy, use_reentrant=False)
        else:
            found = _chunk(*piece, temperature, head, entropy)
        picked.append(found[0])
        entropies.append(found[1])
    return torch.cat(picked, dim=1), torch.cat(entropies, dim=1) if entropy else None


def _chunk(out, labels, temperature: float, head, entropy: bool) -> tuple:
    logits = head(out) if head is not None else out
    logps = torch.log_softmax(logits.float() / temperature, dim=-1)
    picked = logps.gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1) * (labels != IGNORE_INDEX)
    if not entropy:
        return picked, None
    with torch.no_grad():
        return picked, -(logps.exp() * logps).sum(-1)
