"""A user's own recipes module (`MODULE=real_width_recipes CONFIG=nki_moe_real_width`, this folder on PYTHONPATH):
Qwen3-30B-A3B's real width, vocabulary and heads with 2 layers of 8 experts (top 2). No MODEL has that shape, so
tests/test_finetune_real_shapes.py trains it the way the README offers for any other model: a config function.
"""

import dataclasses

from neuron_qwen3 import config_registry, shapes

SHAPE = dataclasses.replace(shapes.FLAVORS["30B-A3B"], n_layers=2, num_experts=8, top_k=2)


def nki_moe_real_width():
    """The nki_moe smoke twin's training settings (bundled tokenizer) at this shape. It derives from the full
    nki_moe config and keeps its report (variant nki_moe, scale full), so on CPU it computes in float32 as that
    one does (finish.cpu_float32)."""
    return config_registry._with_small_model(config_registry.nki_moe_qwen3_30b_a3b(), "real_width", SHAPE)
