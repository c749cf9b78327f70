"""A packed window's attention mask as the kernels take it: where each token's document starts.

torchtitan describes the same mask as a flex BlockMask, built by `create_block_mask` under torch.compile, which
Inductor lowers: a device without Inductor (Trainium) cannot build it. The document starts are two eager ops on
the positions, O(sequence), and both the PyTorch reference and nkilib's kernels (`bound_min`) read them directly.
"""

from dataclasses import dataclass

import torch


def document_starts(positions: torch.Tensor) -> torch.Tensor:
    """[B, L] positions restarting at 0 at each document -> [B, L] int32: the index of each token's document's first
    token. Query i then attends keys j with starts[i] <= j <= i. Tokens before the first 0 are one document from 0,
    as torchtitan's document mask counts them."""
    assert positions.dim() == 2, f"positions must be [batch, seq], got {tuple(positions.shape)}"
    index = torch.arange(positions.shape[1], device=positions.device, dtype=torch.int64).expand_as(positions)
    first = torch.where(positions == 0, index, torch.zeros_like(index))
    return torch.cummax(first, dim=1).values.to(torch.int32)


@dataclass(frozen=True)
class DocumentMask:
    """What the trainer hands each attention layer in place of torchtitan's BlockMask (trainer.prepare_inputs)."""

    starts: torch.Tensor  # [B, L] int32

    @classmethod
    def of(cls, positions: torch.Tensor) -> "DocumentMask":
        return cls(document_starts(positions))
