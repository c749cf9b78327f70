"""Native torchtitan attention forward+backward on CPU; prints the max error against SDPA.

argv[1]: "patched" applies the CPU adapter, "upstream" does not; torchtitan is imported first either way.
"""

import sys

import torch

from torchtitan.models.common.attention import FlexAttention, create_attention_mask, get_causal_mask_mod

if sys.argv[1] == "patched":
    from neuron_qwen3.quirks import cpu_adapter

    cpu_adapter.activate()

torch.manual_seed(0)
q = torch.randn(2, 64, 4, 16, requires_grad=True)
k, v = torch.randn(2, 64, 2, 16), torch.randn(2, 64, 2, 16)
mask = create_attention_mask(get_causal_mask_mod(), 2, None, 64, 64, device="cpu")
out = FlexAttention(FlexAttention.Config())(q, k, v, attention_masks=mask, enable_gqa=True)
out.sum().backward()
ref = torch.nn.functional.scaled_dot_product_attention(
    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
).transpose(1, 2)
compiled_frames = torch._dynamo.utils.counters["frames"]["total"]  # torch.compile'd frames run so far
print(
    f"max_abs_err={(out - ref).abs().max().item():.3e} grad_finite={bool(q.grad.isfinite().all())} "
    f"compiled_frames={compiled_frames}"
)
