"""The transformers backend's attention shim on CPU, with a grad; prints the error against SDPA.

argv[1]: "patched" applies the CPU adapter, "upstream" does not; torchtitan is imported first either way.
"""

import sys

import torch

from torch.nn.attention.flex_attention import create_block_mask
from torchtitan.experiments.transformers_modeling_backend.model import _flex_attention_torchtitan

if sys.argv[1] == "patched":
    from neuron_qwen3.quirks import cpu_adapter

    cpu_adapter.activate()

torch.manual_seed(0)
module = torch.nn.Module()  # training mode; HF passes the attention layer itself
q = torch.randn(1, 4, 32, 16, requires_grad=True)
k, v = torch.randn(1, 2, 32, 16), torch.randn(1, 2, 32, 16)
mask = create_block_mask(lambda b, h, qi, ki: ki <= qi, 1, None, 32, 32, device="cpu")
out, _ = _flex_attention_torchtitan(module, q, k, v, mask, scaling=0.25)
out.sum().backward()
ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25, enable_gqa=True)
print(f"max_abs_err={(out - ref.transpose(1, 2)).abs().max().item():.3e}")
