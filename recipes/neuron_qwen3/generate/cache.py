"""The KV cache and the attention that reads it, at shapes fixed before the first token.

Keys and values live in two tensors allocated once, [layers, slots, KV heads, length, head dim]. A forward pass
writes its new tokens' keys and values at each slot's own positions (from the slot's start on) and its queries attend to
the first `Step.keys` cache positions, masked to those at or before their own position: a prefill of a
right-padded prompt bucket (start 0, keys = the bucket) or one decode token per slot (start = the slot's length,
keys = the whole cache). Nothing about the prompts or the step changes a shape, so a compiled graph serves every
round. Positions past a slot's length hold stale or padding entries; the mask never lets a query see them.

The model's own attention modules do the projections, norms and RoPE; only the step after RoPE is replaced:
torchtitan's `inner_attention` (CacheAttention) or transformers' attention function (hf_cache_attention). The
maths is causal softmax attention with GQA in float32, on every device. nkilib's token-generation attention
(attention_tkg) is a building block NKI kernels call with their SBUF allocator, one KV head at a time, the step's
keys apart from the cache: wiring it here means an NKI kernel of our own around it, checked on a trn2.
"""

import contextlib

import torch

HF_ATTENTION_NAME = "neuron_qwen3_kv_cache"  # the implementation's name in transformers' AttentionInterface
HF_STATE = "neuron_qwen3_kv_cache"  # the attribute of each transformers attention module that points to the cache


class Step:
    """One forward pass's place in the cache: the `new` tokens of slot s go to positions start[s], start[s] + 1, ...;
    queries read positions [0, keys). The write indices and the mask, the same in every layer, are made once here."""

    def __init__(self, start: torch.Tensor, new: int, keys: int):
        self.new, self.keys = new, keys
        self.columns = start[:, None] + torch.arange(new, device=start.device)  # [slots, new]; start: [slots] int64
        self.rows = torch.arange(len(start), device=start.device)[:, None].expand(len(start), new)
        # [slots, new, keys]: True where the query may not look (a position after its own)
        self.hidden = torch.arange(keys, device=start.device)[None, None, :] > self.columns[:, :, None]
        self._masks = {}

    def mask(self, group: int, begin: int, end: int) -> torch.Tensor:
        """[slots, 1, group x (end - begin), keys]: `hidden` of the queries [begin, end) for the `group` query heads
        that share a KV head, as rows."""
        if (group, begin, end) not in self._masks:
            slots, block = self.hidden.shape[0], end - begin
            repeated = self.hidden[:, None, None, begin:end].expand(slots, 1, group, block, self.keys)
            self._masks[group, begin, end] = repeated.reshape(slots, 1, group * block, self.keys)
        return self._masks[group, begin, end]


class KVCache:
    """Keys and values for `layers` x `slots` sequences of up to `length` tokens, allocated at the first write
    (the dtype and device of the keys the model computes), once. A pass's queries attend `query_block` at a time,
    so a prefill's float32 scores take slots x heads x query_block x keys, not the bucket's square."""

    def __init__(self, layers: int, slots: int, length: int, query_block: int):
        self.layers, self.slots, self.length, self.query_block = layers, slots, length, query_block
        self.k = self.v = None
        self.step: Step | None = None

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q [slots, Hq, L, D], k and v [slots, Hkv, L, D] after RoPE -> the attention output [slots, Hq, L, D]."""
        step = self.step
        assert step is not None, "the cache is read outside a generator step"
        slots, heads, new, dim = q.shape
        assert slots == self.slots and new == step.new, f"{slots} x {new} queries for {self.slots} x {step.new}"
        if self.k is None:
            shape = (self.layers, self.slots, k.shape[1], self.length, dim)
            self.k = torch.zeros(shape, dtype=k.dtype, device=k.device)
            self.v = torch.zeros(shape, dtype=v.dtype, device=v.device)
        assert self.k.dtype == k.dtype, f"keys of {k.dtype} for a cache of {self.k.dtype}"
        self.k[layer][step.rows, :, step.columns] = k.transpose(1, 2)
        self.v[layer][step.rows, :, step.columns] = v.transpose(1, 2)
        keys, values = self.k[layer][:, :, : step.keys].float(), self.v[layer][:, :, : step.keys].float()
        kv_heads = keys.shape[1]
        group = heads // kv_heads
        outs = []
        for begin in range(0, new, self.query_block):
            end = min(new, begin + self.query_block)
            # each KV head's group of query heads as one block of rows: [slots, KV heads, group x block, dim]
            grouped = q[:, :, begin:end].reshape(slots, kv_heads, group * (end - begin), dim).float()
            scores = torch.matmul(grouped, keys.transpose(-1, -2)) * scale
            scores = scores.masked_fill(step.mask(group, begin, end), float("-inf"))
            outs.append(torch.matmul(scores.softmax(dim=-1), values).reshape(slots, heads, end - begin, dim))
        return torch.cat(outs, dim=2).to(q.dtype) if len(outs) > 1 else outs[0].to(q.dtype)


class CacheAttention(torch.nn.Module):
    """torchtitan's inner attention contract (q, k, v as [B, L, N, H]) over the cache of layer `layer`."""

    def __init__(self, cache: KVCache, layer: int):
        super().__init__()
        self.cache, self.layer = cache, layer

    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks=None, scale=None, enable_gqa=False, **kwargs):
        scale = q_BLNH.shape[-1] ** -0.5 if scale is None else scale
        out = self.cache.attend(
            self.layer, q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2), scale
        )
        return out.transpose(1, 2)


def hf_cache_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """transformers' AttentionInterface contract (q, k, v [B, N, L, H] in, ([B, L, N, H], None) out) over the cache
    the generator hung on the module. transformers makes no mask for an implementation of its own: the cache's
    step is the mask."""
    cache = getattr(module, HF_STATE)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    return cache.attend(module.layer_idx, query, key, value, scale).transpose(1, 2).contiguous(), None


def layers_of(model) -> list:
    """The decoder layers of torchtitan's Qwen3, its transformers backend's model or a transformers model."""
    if hasattr(model, "layers"):
        return list(model.layers.values()) if hasattr(model.layers, "values") else list(model.layers)
    return list(model.model.layers)


@contextlib.contextmanager
def installed(model, cache: KVCache):
    """The model's attention reads and writes `cache` inside the block; its own attention is back after."""
    layers = layers_of(model)
    assert len(layers) == cache.layers, f"{len(layers)} layers for a cache of {cache.layers}"
    if hasattr(layers[0], "self_attn"):  # transformers' decoder layers
        from transformers import AttentionInterface

        AttentionInterface.register(HF_ATTENTION_NAME, hf_cache_attention)
        modules = [layer.self_attn for layer in layers]
        configs = list({id(m.config): m.config for m in modules}.values())
        saved = [config._attn_implementation for config in configs]
        for module in modules:
            setattr(module, HF_STATE, cache)
        for config in configs:
            config._attn_implementation = HF_ATTENTION_NAME
        try:
            yield
        finally:
            for config, name in zip(configs, saved):
                config._attn_implementation = name
            for module in modules:
                delattr(module, HF_STATE)
        return
    saved = [layer.attention.inner_attention for layer in layers]
    for i, layer in enumerate(layers):
        layer.attention.inner_attention = CacheAttention(cache, i)
    try:
        yield
    finally:
        for layer, inner in zip(layers, saved):
            layer.attention.inner_attention = inner
