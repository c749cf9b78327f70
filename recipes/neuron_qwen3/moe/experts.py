"""Qwen3 MoE routed experts on nkilib's blockwise kernels, swapped in by torchtitan's override registry.

Enable with `--override.imports neuron_qwen3.moe.experts.nki_grouped_experts` (the nki_moe recipe
sets it in `config.override.imports`). Settings ride along as override kwargs, e.g.
`'neuron_qwen3.moe.experts.nki_grouped_experts={"block_size": 512}'`.

One op, `torch.ops.neuron_qwen3.blockwise_moe_experts`, computes the experts in nkilib's blockwise
layout (see layout.py); the weights come in torchtitan's layout (gate w1 [E, F, D], up
w3 [E, F, D], down w2 [E, D, F]; F = I, D = H):

    (hidden_states [T+1, H], expert_affinities_masked [(T+1)*E, 1], w1, w3, w2,
     token_position_to_id [N*B], block_to_expert [N, 1], block_size)
      -> out [T, H], gate_up_activations_T [N, 2, I, B], down_activations [N, B, H]

    for each block n with expert e = block_to_expert[n] and slot tokens t = token_position_to_id[nB:(n+1)B]:
        gate, up = x[t] @ w1[e]^T, x[t] @ w3[e]^T            (row T of x, the padding token, is zeros)
        down     = (silu(gate) * up) @ w2[e]^T
        out[t]  += affinity[t, e] * down                       (routing weight AFTER the expert)

The last two outputs are the activation checkpoints the backward consumes, in the kernels' layout;
`blockwise_moe_experts()` returns just `out`. On a `neuron` device the op runs nkilib's `moe_cte` and
`blockwise_mm_bwd` through nki_kernels.py, which packs the weights into the kernels' layout
(gate_up_proj_weight [E, H, 2, I], down_proj_weight [E, I, H]: layout.pack_*) and unpacks the
weight gradients. Elsewhere it runs reference.py, the same blocked computation in PyTorch.
The Config's `kernel` (auto|nki|reference; the trainer sets it from `--neuron.moe_kernel`) picks the path
(auto: nki on neuron devices); the model build checks the shapes against every limit of the kernels when the path
will be nki. On that path a forward without autograd whose rows fit nkilib's token-generation kernel (a
generator's decode step: a few rows per expert, up to 128 in all) runs `moe_tkg` on the rows themselves instead of
blocks of `block_size` rows per expert (nki_kernels.decode_fits).

How it replaces torchtitan's GroupedExperts (torchtitan/models/common/moe.py): RoutedExperts calls
`inner_experts(x_RD, num_tokens_per_expert_E)` with the routed rows already sorted by expert
(LocalTokenDispatcher: stable argsort; the EP dispatchers: grouped per local expert), and applies
the routing scores itself, in `token_dispatcher.combine`, after the experts. So NKIGroupedExperts
treats each routed row as one "token" of the kernel: token_position_to_id maps block slots to
rows, block_to_expert comes from the counts, and the affinities are 1 at (row, its expert) -- the
kernel's post-scaling is then the identity and combine applies the real scores exactly as it does
for torchtitan's experts. The expert math and its dtype follow GroupedExperts.forward: inputs and
weights cast to bf16, silu(x w1^T) * (x w3^T) w2^T, result cast back to the input dtype.
"""

import functools
from dataclasses import dataclass
from typing import Literal

import torch
from torch.distributed.tensor import DTensor
from torchtitan.config.override import derive, override
from torchtitan.models.common.moe import GroupedExperts
from torchtitan.tools import utils as titan_utils
from torchtitan.tools.logging import logger

from neuron_qwen3.moe import nki_kernels
from neuron_qwen3.moe.layout import (
    BlockLayout,
    ExpertWeights,
    max_num_blocks,
    presorted_block_layout,
    presorted_row_experts,
    unit_affinities,
)
from neuron_qwen3.moe.reference import reference_backward, reference_forward
from neuron_qwen3.neuron_sdk import KERNELS, kernel_path

__all__ = ["NKIGroupedExperts", "blockwise_moe_experts", "nki_grouped_experts"]

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@functools.cache
def _log_kernel_path(path: str, device_type: str, kernel: str) -> None:
    # The integration tests grep for "nki_moe kernel path: <path>".
    logger.info(f"nki_moe kernel path: {path} (device {device_type}, kernel {kernel})")


# ---- the op ------------------------------------------------------------------------------------
# torch.library ops take tensors and scalars only: the op's signature is flat, and it builds the
# ExpertWeights / BlockLayout objects that the reference and the kernels take.


def _objects(hidden_states, w1_EFD, w3_EFD, w2_EDF, token_position_to_id, block_to_expert, block_size):
    layout = BlockLayout(token_position_to_id, block_to_expert, hidden_states.shape[0] - 1, block_size)
    return ExpertWeights(w1_EFD, w3_EFD, w2_EDF), layout


@torch.library.custom_op("neuron_qwen3::blockwise_moe_experts", mutates_args=())
def _blockwise_moe_experts_op(
    hidden_states: torch.Tensor,
    expert_affinities_masked: torch.Tensor,
    w1_EFD: torch.Tensor,
    w3_EFD: torch.Tensor,
    w2_EDF: torch.Tensor,
    token_position_to_id: torch.Tensor,
    block_to_expert: torch.Tensor,
    block_size: int,
    kernel: str,
    lnc: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    weights, layout = _objects(hidden_states, w1_EFD, w3_EFD, w2_EDF, token_position_to_id, block_to_expert, block_size)
    path = kernel_path(kernel, hidden_states.device.type)
    _log_kernel_path(path, hidden_states.device.type, kernel)  # here, where the path is taken, compiled or not
    if path == "nki":
        return nki_kernels.moe_cte_forward(hidden_states, expert_affinities_masked, weights, layout, lnc)
    return reference_forward(hidden_states, expert_affinities_masked, weights, layout)


@_blockwise_moe_experts_op.register_fake
def _(
    hidden_states,
    expert_affinities_masked,
    w1_EFD,
    w3_EFD,
    w2_EDF,
    token_position_to_id,
    block_to_expert,
    block_size,
    kernel,
    lnc,
):
    num_rows, dim = hidden_states.shape
    hidden = w1_EFD.shape[1]
    num_blocks = block_to_expert.shape[0]
    return (
        hidden_states.new_empty(num_rows - 1, dim),
        hidden_states.new_empty(num_blocks, 2, hidden, block_size),
        hidden_states.new_empty(num_blocks, block_size, dim),
    )


@torch.library.custom_op("neuron_qwen3::blockwise_moe_experts_backward", mutates_args=())
def _blockwise_moe_experts_backward_op(
    grad_output: torch.Tensor,
    hidden_states: torch.Tensor,
    expert_affinities_masked: torch.Tensor,
    w1_EFD: torch.Tensor,
    w3_EFD: torch.Tensor,
    w2_EDF: torch.Tensor,
    gate_up_act_T: torch.Tensor,
    down_act: torch.Tensor,
    token_position_to_id: torch.Tensor,
    block_to_expert: torch.Tensor,
    block_size: int,
    kernel: str,
    lnc: int,
    affinity_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    weights, layout = _objects(hidden_states, w1_EFD, w3_EFD, w2_EDF, token_position_to_id, block_to_expert, block_size)
    args = (grad_output, hidden_states, expert_affinities_masked, weights, (gate_up_act_T, down_act), layout)
    if kernel_path(kernel, hidden_states.device.type) == "nki":
        return nki_kernels.blockwise_mm_backward(*args, lnc)  # the kernel computes every gradient
    return reference_backward(*args, affinity_grad=affinity_grad)


@_blockwise_moe_experts_backward_op.register_fake
def _(
    grad_output,
    hidden_states,
    expert_affinities_masked,
    w1_EFD,
    w3_EFD,
    w2_EDF,
    gate_up_act_T,
    down_act,
    token_position_to_id,
    block_to_expert,
    block_size,
    kernel,
    lnc,
    affinity_grad,
):
    return tuple(torch.empty_like(t) for t in (hidden_states, expert_affinities_masked, w1_EFD, w3_EFD, w2_EDF))


def _setup_context(ctx, inputs, output) -> None:
    *tensors, token_position_to_id, block_to_expert, block_size, kernel, lnc = inputs  # hidden, affinities, w1, w3, w2
    _, gate_up_act_T, down_act = output
    ctx.save_for_backward(*tensors, gate_up_act_T, down_act, token_position_to_id, block_to_expert)
    ctx.block_size, ctx.kernel, ctx.lnc = block_size, kernel, lnc
    ctx.mark_non_differentiable(gate_up_act_T, down_act)


def _backward(ctx, grad_out, _grad_gate_up_act_T, _grad_down_act):
    grads = _blockwise_moe_experts_backward_op(
        grad_out.contiguous(), *ctx.saved_tensors, ctx.block_size, ctx.kernel, ctx.lnc, ctx.needs_input_grad[1]
    )
    return (*grads, None, None, None, None, None)


_blockwise_moe_experts_op.register_autograd(_backward, setup_context=_setup_context)


def blockwise_moe_experts(
    hidden_states: torch.Tensor,
    expert_affinities_masked: torch.Tensor,
    weights: ExpertWeights,
    layout: BlockLayout,
    kernel: str = "auto",
    lnc: int = 2,
) -> torch.Tensor:
    """The experts' combined output [T, H] (see the module docstring); differentiable. `kernel`: see
    kernel_path; `lnc`: the NKI kernels' logical NeuronCore config."""
    out, _, _ = _blockwise_moe_experts_op(
        hidden_states,
        expert_affinities_masked,
        weights.w1_EFD,
        weights.w3_EFD,
        weights.w2_EDF,
        layout.token_position_to_id,
        layout.block_to_expert,
        layout.block_size,
        kernel,
        lnc,
    )
    return out


# ---- the torchtitan module and its override ----------------------------------------------------


class NKIGroupedExperts(GroupedExperts):
    """torchtitan's GroupedExperts computed by the blockwise op: same parameters, same math.

    Parameters stay `w1_EFD` / `w2_EDF` / `w3_EFD` with torchtitan's shapes (checkpoints and
    sharding specs move unchanged between the native and nki_moe ways) and go to the op as they
    are (cast to the compute dtype, as GroupedExperts does), so their gradients come back in
    their own layout. The `_grouped_mm` seam of GroupedExperts is not used.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        block_size: int = 256
        """Tokens per block (B). 256, 512 and 1024 are what both kernels take (nki_kernels.check_kernel_shapes)."""
        compute_dtype: Literal["bfloat16", "float32"] = "bfloat16"
        """bfloat16 is GroupedExperts' own cast (and the kernels'); float32 is for the reference only."""
        block_count: Literal["auto", "exact", "static"] = "auto"
        """N: "exact" sum ceil(count/B) (host sync), "static" the bound max_num_blocks (fixed
        shapes for compiled graphs), "auto" static on the NKI path or under torch.compile, else exact."""
        kernel: Literal["auto", "nki", "reference"] = "auto"
        """The op's implementation: auto is NKI on Neuron and the reference elsewhere (kernel_path)."""
        logical_nc_config: int = 2
        """The NKI kernels' LNC, which must equal the graph's (error NCC_EVRF066)."""

    def __init__(self, config: Config):
        super().__init__(config)
        if config.block_size < 1:
            raise ValueError(f"block_size must be positive, got {config.block_size}")
        if config.compute_dtype not in _DTYPES:
            raise ValueError(f"compute_dtype must be one of {list(_DTYPES)}, got {config.compute_dtype!r}")
        if config.block_count not in ("auto", "exact", "static"):
            raise ValueError(f"block_count must be auto, exact or static, got {config.block_count!r}")
        if config.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {config.kernel!r}")
        # At build, not in the first kernel compile: the trainer's device (devices.set_up) decides whether the
        # kernels will see these shapes.
        if kernel_path(config.kernel, titan_utils.device_type) == "nki":
            nki_kernels.check_kernel_shapes(config.dim, config.hidden_dim, config.block_size, config.logical_nc_config)
        self.block_size = config.block_size
        self.compute_dtype = _DTYPES[config.compute_dtype]
        self.block_count = config.block_count
        self.kernel, self.lnc = config.kernel, config.logical_nc_config

    def expert_weights(self) -> tuple:
        """(w1, w2, w3) as forward computes with them: local shards under EP / TP, as GroupedExperts. LoRA
        (lora/adapters.py) adds its updates here rather than behind the parameters' names, which FSDP reads."""
        if isinstance(self.w1_EFD, DTensor):
            return self.w1_EFD.to_local(), self.w2_EDF.to_local(), self.w3_EFD.to_local()
        return self.w1_EFD, self.w2_EDF, self.w3_EFD

    def forward(self, x_RD: torch.Tensor, num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
        """Same contract as GroupedExperts.forward: rows grouped by expert in, per-row outputs out."""
        w1_EFD, w2_EDF, w3_EFD = self.expert_weights()

        num_rows, dim = x_RD.shape
        num_experts = w1_EFD.shape[0]
        dtype = self.compute_dtype
        weights = ExpertWeights(w1_EFD.to(dtype), w3_EFD.to(dtype), w2_EDF.to(dtype))
        nki = kernel_path(self.kernel, x_RD.device.type) == "nki"
        if nki and not torch.is_grad_enabled() and nki_kernels.decode_fits(num_rows, dim, dtype, self.lnc):
            self.block_rows = num_rows
            expert_of_row = presorted_row_experts(num_tokens_per_expert_E, num_rows)
            return nki_kernels.moe_tkg_forward(x_RD.to(dtype), expert_of_row, weights, self.lnc).type_as(x_RD)
        static = self.block_count == "static" or (self.block_count == "auto" and (nki or torch.compiler.is_compiling()))
        num_blocks = max_num_blocks(num_rows, num_experts, self.block_size) if static else None
        layout = presorted_block_layout(num_tokens_per_expert_E, num_rows, self.block_size, num_blocks)
        self.block_rows = layout.block_to_expert.shape[0] * self.block_size  # what the kernel computes (a shape)

        hidden_T1H = torch.cat([x_RD.to(dtype), x_RD.new_zeros(1, dim, dtype=dtype)])
        out_RD = blockwise_moe_experts(
            hidden_T1H, unit_affinities(layout, num_experts, dtype), weights, layout, self.kernel, self.lnc
        )
        return out_RD.type_as(x_RD)


@override(
    target=GroupedExperts.Config,
    exact=True,
    description="Routed experts on nkilib's blockwise MoE kernels (moe_cte + blockwise_mm_bwd); "
    "PyTorch reference of the same blocked computation off Neuron.",
)
def nki_grouped_experts(cfg: GroupedExperts.Config, **settings: object) -> NKIGroupedExperts.Config:
    """Replace a stock GroupedExperts with NKIGroupedExperts (params, init and sharding kept).

    `settings` are NKIGroupedExperts.Config fields (block_size, compute_dtype, block_count, kernel, LNC),
    given as override kwargs; an unknown name raises. `exact=True`: subclasses of
    GroupedExperts.Config (GPT-OSS's experts with biases, FusedGroupedExperts) are left alone.
    """
    return derive(cfg, NKIGroupedExperts.Config, **settings)
