"""Lets torchtitan 0.3.0 train on a CPU-only host (gloo), for tests, CI and laptops.

torchtitan assumes an accelerator. Each patch below names the upstream behaviour it works
around; tests/test_cpu_adapter.py has one test per patch that fails when it is removed.
The adapter is applied only when torch sees no accelerator (see `needed`), so it is inert on
Neuron and CUDA, and it refuses to run against a torchtitan it was not written for.

It runs in the worker after torchtitan is imported (stock `torchtitan.train` imports its trainer before
the recipes), so each patched name is rebound in every torchtitan module that imported it (devices.rebind).
"""

import os
import resource
import sys
import types

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.nn.attention.flex_attention import AuxOutput, BlockMask, create_block_mask, create_mask
from torch.utils._python_dispatch import TorchDispatchMode

SUPPORTED_TORCHTITAN = "0.3.0"


def needed() -> bool:
    """True when torch finds no accelerator: the case torchtitan mistakes for CUDA."""
    return torch._utils._get_available_device_type() is None


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _total_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _cpu_device_module() -> types.SimpleNamespace:
    """The slice of the torch.cuda API torchtitan calls, answered for the host.

    Peak memory is the process's peak resident set size, so the trainer's memory line means
    something on CPU too (reset_peak_memory_stats cannot lower a kernel counter: it is a no-op).
    """
    peak = lambda: {"active_bytes.all.peak": _peak_rss_bytes(), "reserved_bytes.all.peak": _peak_rss_bytes()}
    return types.SimpleNamespace(
        set_device=lambda device: None,
        current_device=lambda: 0,
        device_count=lambda: 1,
        synchronize=lambda *a, **k: None,
        empty_cache=lambda: None,
        reset_peak_memory_stats=lambda *a, **k: None,
        get_device_name=lambda *a, **k: "cpu",
        get_device_properties=lambda *a, **k: types.SimpleNamespace(name="cpu", total_memory=_total_memory_bytes()),
        memory_stats=lambda *a, **k: peak(),
        is_available=lambda: True,
    )


class WholeDraws(TorchDispatchMode):
    """An in-place random fill of a sharded DTensor drawn whole, every rank keeping its own shard.

    Upstream: DTensor draws a random op through its RNG tracker only on cuda-like devices
    (torch.distributed.tensor._random.is_rng_supported_mesh); on CPU each rank fills its own shard from its own
    generator, which torchtitan seeds alike on every rank. FSDP's dim-0 shards of a randomly initialised matrix
    then came out equal: on 2 ranks each one was one draw, twice. Under this mode every rank draws the whole
    tensor from the same generator state and cuts its own shard (no communication), so a run's initial weights
    are a 1-rank run's, whatever its number of ranks.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else None
        sharded = isinstance(target, DTensor) and any(isinstance(p, Shard) for p in target.placements)
        if not (sharded and torch.Tag.nondeterministic_seeded in func.tags):
            return func(*args, **kwargs)
        assert func._schema.name.endswith("_"), f"{func}: an out-of-place random op on a sharded DTensor"
        full = torch.empty(target.shape, dtype=target.dtype, device=target.device)
        func(full, *args[1:], **kwargs)
        target.copy_(distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None))
        return target


def whole_draws_at_init(parallelize_fn):
    """The model spec's parallelize function, its model's `init_states` (what the trainer calls after to_empty,
    adapters included when LoRA wrapped it first) then run under WholeDraws."""

    def parallelize(model, *args, **kwargs):
        model = parallelize_fn(model, *args, **kwargs)
        init = model.init_states

        def init_states(*, buffer_device=None):
            with WholeDraws():
                init(buffer_device=buffer_device)

        model.init_states = init_states
        return model

    return parallelize


def dense_attention(q, k, v, block_mask: BlockMask, *, scale=None, enable_gqa=False, return_lse=False):
    """flex_attention's maths with the block mask materialised: flex has no CPU backward.

    q, k, v are (batch, heads, seq, head_dim). Returns (out, lse or None).
    """
    mask = create_mask(block_mask.mask_mod, q.shape[0], 1, q.shape[2], k.shape[2], device=q.device)
    if not return_lse:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa), None
    if enable_gqa:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    scores = scores.float().masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - lse.unsqueeze(-1)).to(v.dtype) @ v
    return out, lse


def _native_flex_attention(q, k, v, *, score_mod, block_mask, scale, enable_gqa, return_aux, kernel_options):
    """Stands in for `FlexAttention.compiled_flex_attn` (torchtitan/models/common/attention.py)."""
    if score_mod is not None:
        raise NotImplementedError("the CPU attention stand-in supports mask_mod only, not score_mod")
    out, lse = dense_attention(q, k, v, block_mask, scale=scale, enable_gqa=enable_gqa, return_lse=return_aux.lse)
    return out, AuxOutput(lse=lse)


def _hf_flex_attention_forward(module, query, key, value, attention_mask, scaling=None, softcap=None, **kwargs):
    """Stands in for transformers' `flex_attention_forward`, which the transformers backend calls."""
    if softcap is not None or kwargs.get("s_aux") is not None or kwargs.get("position_bias") is not None:
        raise NotImplementedError(
            "the CPU attention stand-in does not support softcap, attention sinks or position bias"
        )
    if not isinstance(attention_mask, BlockMask):
        raise TypeError(f"the CPU attention stand-in expects a flex BlockMask, got {type(attention_mask)}")
    out, _ = dense_attention(
        query, key, value, attention_mask, scale=scaling, enable_gqa=key.shape[1] != query.shape[1]
    )
    return out.transpose(1, 2).contiguous(), None


def _force_sum_reduction(original):
    """Wraps fsdp.disable_fsdp_gradient_division: torchtitan's divide factor of 1.0 makes FSDP2
    reduce with ReduceOp.PREMUL_SUM, which gloo rejects; plain SUM is equivalent here."""

    def disable_fsdp_gradient_division(model):
        original(model)
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    return disable_fsdp_gradient_division


_active = False


def activate() -> None:
    """Apply every CPU patch. Idempotent; torchtitan's trainer may already be imported."""
    global _active
    if _active:
        return
    import torchtitan

    if torchtitan.__version__ != SUPPORTED_TORCHTITAN:
        raise RuntimeError(
            f"neuron_qwen3.quirks.cpu_adapter patches torchtitan {SUPPORTED_TORCHTITAN} internals; "
            f"found torchtitan {torchtitan.__version__}"
        )
    from neuron_qwen3.quirks.devices import rebind

    # 1. torchtitan/tools/utils.py: `device_type = _get_available_device_type() or "cuda"` picks
    #    CUDA when there is no accelerator; with "cpu" the process group becomes gloo.
    import torchtitan.tools.utils as tt_utils

    rebind(tt_utils, "device_type", "cpu")
    rebind(tt_utils, "device_module", _cpu_device_module())

    # 2. gloo has no PREMUL_SUM (see _force_sum_reduction); parallelize modules import the function by name.
    import torchtitan.distributed.fsdp as tt_fsdp

    rebind(tt_fsdp, "disable_fsdp_gradient_division", _force_sum_reduction(tt_fsdp.disable_fsdp_gradient_division))

    # 3. torchtitan's language models accept only flex/varlen attention, and flex_attention has
    #    no backward on CPU: run the same masked attention densely, in both the native models
    #    and the transformers backend (which routes through transformers' flex integration).
    #    The block mask itself is built by a torch.compile'd create_block_mask; the dense path
    #    only needs its mask_mod, so build it eagerly (saves ~20 s of Inductor per run on CPU).
    import torchtitan.models.common.attention as tt_attention

    tt_attention.FlexAttention.compiled_flex_attn = staticmethod(_native_flex_attention)
    tt_attention._compiled_create_block_mask = create_block_mask
    # The transformers backend (v5) is imported only by the runs that use it: patched when it is loaded.
    hf_backend_model = sys.modules.get("torchtitan.experiments.transformers_modeling_backend.model")
    if hf_backend_model is not None:
        hf_backend_model.flex_attention_forward = _hf_flex_attention_forward
    _active = True
