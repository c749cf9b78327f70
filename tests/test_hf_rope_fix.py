"""The v5 RoPE bug (torchtitan 0.3.0 + transformers 5.x): inv_freq is garbage after meta init.

Builds the v5 smoke model exactly as torchtitan's Trainer does (meta device, to_empty,
init_weights), with the buffer poisoned as uninitialised memory would be, and checks that
init leaves the rotary frequencies the ones transformers computes, only when the fix is on. The v5 trainer
(neuron_qwen3/v5.py) applies it before the model is built; the v5 smoke runs of tests/test_training.py (finite,
falling losses) are the run-path proof.
"""

import json

import pytest
import torch


from torchtitan.experiments.transformers_modeling_backend.model import HFTransformerModel

from neuron_qwen3 import config_registry
from neuron_qwen3.quirks import hf_rope_fix

hf_rope_fix.apply()  # as Qwen3TransformersTrainer.__init__ does


def _materialised_v5_smoke_model(config=None):
    config = config or config_registry.v5_qwen3_smoke()
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    with torch.device("meta"):
        model = model_config.build()
    model.to_empty(device="cpu")
    for module in model.model.modules():
        if hasattr(module, "inv_freq"):
            module.inv_freq.fill_(float("nan"))  # what to_empty may leave: any bit pattern
    return model


def _expected_inv_freq():
    hf = json.loads((config_registry.HF_MODEL["smoke"] / "config.json").read_text())
    dim, theta = hf["head_dim"], hf["rope_parameters"]["rope_theta"]
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))


def test_fix_restores_rotary_frequencies():
    model = _materialised_v5_smoke_model()
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    rotary = [m for m in model.model.modules() if hasattr(m, "inv_freq")]
    assert rotary, "the HF model has no rotary module: the fix has nothing to fix"
    for module in rotary:
        torch.testing.assert_close(module.inv_freq, _expected_inv_freq())
        torch.testing.assert_close(module.original_inv_freq, _expected_inv_freq())


def test_upstream_init_leaves_garbage(monkeypatch):
    """Guards the fix's reason to exist: if upstream starts re-initialising, drop hf_rope_fix."""
    config = config_registry.v5_qwen3_smoke()
    monkeypatch.setattr(HFTransformerModel, "init_states", HFTransformerModel.init_states.upstream)
    model = _materialised_v5_smoke_model(config)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    rotary = [m for m in model.model.modules() if hasattr(m, "inv_freq")]
    assert rotary and all(torch.isnan(m.inv_freq).all() for m in rotary)


def test_apply_is_idempotent():
    hf_rope_fix.apply()
    wrapped = HFTransformerModel.init_states
    hf_rope_fix.apply()
    assert HFTransformerModel.init_states is wrapped


@pytest.mark.parametrize("rope_type", ["linear"])
def test_scaled_rope_uses_transformers_registry(rope_type):
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    cfg = Qwen3Config(
        head_dim=32,
        hidden_size=128,
        num_attention_heads=4,
        rope_parameters={"rope_type": rope_type, "rope_theta": 10000.0, "factor": 2.0},
    )
    module = Qwen3RotaryEmbedding(cfg)
    expected = module.inv_freq.clone()
    module.inv_freq.fill_(0.0)
    assert hf_rope_fix.reinit_rotary_buffers(module) == 1
    torch.testing.assert_close(module.inv_freq, expected)
