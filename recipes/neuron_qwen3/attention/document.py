"""Document-causal attention as one torch op, for torchtitan's Qwen3 (native, nki_moe) and the transformers model (v5).

`torch.ops.neuron_qwen3.document_attention(q, k, v, starts, scale, kernel, lnc) -> (out, lse)`, with its backward
op registered as its autograd; layouts as in reference.py (q [B, Hq, L, D], k/v [B, Hkv, L, D], starts [B, L]). On a
`neuron` device it runs nkilib's training kernels (nki_kernels.py), elsewhere the PyTorch reference: `kernel`
(auto|nki|reference, from `--neuron.attention_kernel`) picks, auto being NKI on Neuron.

Why: torchtitan 0.3.0's language models attend only through flex attention (compiled with Inductor, masks from a
compiled `create_block_mask`) or varlen (CUDA's flash kernel); the transformers backend goes through transformers'
flex integration, compiled too. Trainium has no Inductor. So on Neuron, or when the kernel is forced, finish()
swaps this in:
- native and nki_moe: `document_attention` overrides each FlexAttention.Config (torchtitan's override registry)
  with DocumentAttention, and the trainer hands every layer a masks.DocumentMask in place of the BlockMask;
- v5: `hf_document_attention` is registered with transformers' AttentionInterface under ATTENTION_NAME and the
  model's attention implementation set to it. transformers passes a custom implementation no mask of its own, so
  the function reads the documents from `position_ids`, as transformers' own flash-attention path does for packed
  sequences.
"""

import functools
from dataclasses import dataclass
from typing import Literal

import torch
from torchtitan.config.override import derive, override
from torchtitan.models.common.attention import FlexAttention
from torchtitan.protocols.module import Module
from torchtitan.tools.logging import logger

from neuron_qwen3.attention import nki_kernels
from neuron_qwen3.attention.masks import DocumentMask, document_starts
from neuron_qwen3.attention.reference import reference_backward, reference_forward
from neuron_qwen3.neuron_sdk import kernel_path

ATTENTION_NAME = "neuron_qwen3_document"  # the implementation's name in transformers' AttentionInterface


def replaces_flex(kernel: str, device_type: str) -> bool:
    """Does the run attend through this op? On Neuron always (flex cannot run there); elsewhere when forced."""
    return device_type == "neuron" or kernel != "auto"


@functools.cache
def _log_kernel_path(path: str, device_type: str, kernel: str) -> None:
    logger.info(f"attention kernel path: {path} (device {device_type}, kernel {kernel})")


@torch.library.custom_op("neuron_qwen3::document_attention", mutates_args=())
def _document_attention_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor, scale: float, kernel: str, lnc: int
) -> tuple[torch.Tensor, torch.Tensor]:
    path = kernel_path(kernel, q.device.type)
    _log_kernel_path(path, q.device.type, kernel)
    if path == "nki":
        return nki_kernels.attention_forward(q, k, v, starts, scale, lnc)
    return reference_forward(q, k, v, starts, scale)


@_document_attention_op.register_fake
def _(q, k, v, starts, scale, kernel, lnc):
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.promote_types(q.dtype, torch.float32))


@torch.library.custom_op("neuron_qwen3::document_attention_backward", mutates_args=())
def _document_attention_backward_op(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    starts: torch.Tensor,
    scale: float,
    kernel: str,
    lnc: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if kernel_path(kernel, q.device.type) == "nki":
        return nki_kernels.attention_backward(grad_out, q, k, v, out, lse, starts, scale, lnc)
    return reference_backward(grad_out, q, k, v, out, lse, starts, scale)


@_document_attention_backward_op.register_fake
def _(grad_out, q, k, v, out, lse, starts, scale, kernel, lnc):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, starts, scale, kernel, lnc = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, starts)
    ctx.scale, ctx.kernel, ctx.lnc = scale, kernel, lnc
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, out, lse, starts = ctx.saved_tensors
    dq, dk, dv = _document_attention_backward_op(
        grad_out.contiguous(), q, k, v, out, lse, starts, ctx.scale, ctx.kernel, ctx.lnc
    )
    return dq, dk, dv, None, None, None, None


_document_attention_op.register_autograd(_backward, setup_context=_setup_context)


def document_attention_op(q, k, v, starts, scale: float, kernel: str = "auto", lnc: int = 2) -> torch.Tensor:
    """The attention output [B, Hq, L, D] (see the module docstring); differentiable in q, k and v."""
    out, _ = _document_attention_op(q.contiguous(), k.contiguous(), v.contiguous(), starts, scale, kernel, lnc)
    return out


# ---- torchtitan: the inner attention of native and nki_moe ---------------------------------------------------


class DocumentAttention(Module):
    """torchtitan's FlexAttention contract (q, k, v as [B, L, N, H], `attention_masks`, `scale`) on the op."""

    @dataclass(kw_only=True, slots=True)
    class Config(Module.Config):
        kernel: Literal["auto", "nki", "reference"] = "auto"
        """The op's implementation: auto is NKI on Neuron and the reference elsewhere (kernel_path)."""
        logical_nc_config: int = 2
        """The NKI kernels' LNC, which must equal the graph's."""

    def __init__(self, config: Config):
        super().__init__()
        self.kernel, self.lnc = config.kernel, config.logical_nc_config

    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks, scale=None, enable_gqa=False, **kwargs):
        assert isinstance(attention_masks, DocumentMask), (
            f"document attention takes a DocumentMask (trainer.post_dataloading_process), got {type(attention_masks)}"
        )
        scale = q_BLNH.shape[-1] ** -0.5 if scale is None else scale
        out_BNLH = document_attention_op(
            q_BLNH.transpose(1, 2),
            k_BLNH.transpose(1, 2),
            v_BLNH.transpose(1, 2),
            attention_masks.starts,
            scale,
            self.kernel,
            self.lnc,
        )
        return out_BNLH.transpose(1, 2)


@override(
    target=FlexAttention.Config,
    exact=True,
    description="Document-causal attention on nkilib's training attention kernels; its PyTorch reference off "
    "Neuron. No Inductor: the masks are the documents' starts.",
)
def document_attention(cfg: FlexAttention.Config, **settings: object) -> DocumentAttention.Config:
    """Replace FlexAttention with DocumentAttention; `settings` are its Config's fields (kernel, LNC)."""
    return derive(cfg, DocumentAttention.Config, **settings)


# ---- transformers: the v5 model's attention function -----------------------------------------------------------


def hf_document_attention(
    module, query, key, value, attention_mask, scaling=None, position_ids=None, *, kernel, lnc, **kwargs
):
    """transformers' AttentionInterface contract: q, k, v [B, N, L, H] in, ([B, L, N, H], None) out; `kernel` and
    `lnc` bound by use_in_transformers."""
    if position_ids is None:
        raise ValueError("document attention needs position_ids: the packed window's positions")
    unsupported = [name for name in ("softcap", "s_aux", "position_bias") if kwargs.get(name) is not None]
    if unsupported or kwargs.get("sliding_window") is not None:
        raise NotImplementedError(f"document attention does not support {unsupported or ['sliding_window']}")
    positions = position_ids.expand(query.shape[0], -1)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    out = document_attention_op(query, key, value, document_starts(positions), scale, kernel, lnc)
    return out.transpose(1, 2).contiguous(), None


def use_in_transformers(hf_config, kernel: str, lnc: int) -> None:
    """Route a transformers model's attention (built from `hf_config`) through hf_document_attention."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, functools.partial(hf_document_attention, kernel=kernel, lnc=lnc))
    hf_config._attn_implementation = ATTENTION_NAME
