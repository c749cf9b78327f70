"""Fix for an upstream bug that breaks the v5 (transformers backend) variant on every device.

torchtitan 0.3.0 builds the Hugging Face model on the meta device, materialises it with
`to_empty()` and then calls `HFTransformerModel.init_states`. The rotary embedding's `inv_freq`
buffer is computed in the module's `__init__`, so after `to_empty()` it holds whatever memory
was there (zeros, 1e21 and -1.7e38 were seen). `init_states` recomputes it only through the
module's `rope_init_fn` attribute, which transformers 4.57 had and 5.x does not: on 5.x the
buffer stays garbage and the loss is NaN from step 1.

`apply()` wraps `init_states` so that every rotary module with an `inv_freq` buffer gets it
recomputed from its config, through the same function transformers' own `__init__` uses.
tests/test_hf_rope_fix.py fails when this is not applied.

A second: the backend's flavor field `rope_theta` is set on the loaded config as an attribute, which transformers
5 no longer reads (its rotary modules read `rope_parameters`), so a flavor cannot change the RoPE that way.
`with_rope` gives the backend's model config `rope_parameters` among the values it re-applies after loading
`--hf_model`'s config.json (`_titan_injected_model_args`). tests/test_rope_of_folder.py fails without it.
"""

import copy

import torch
from torchtitan.experiments.transformers_modeling_backend.model import HFTransformerModel
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def _rope_init_fn(module: torch.nn.Module):
    """What the rotary module's own __init__ calls: its default, or the registry's scaled kind."""
    rope_type = module.config.rope_parameters["rope_type"]
    if rope_type == "default":
        return type(module).compute_default_rope_parameters
    return ROPE_INIT_FUNCTIONS[rope_type]


def reinit_rotary_buffers(model: torch.nn.Module) -> int:
    """Recompute inv_freq (and original_inv_freq) of every rotary module; returns how many."""
    count = 0
    for module in model.modules():
        if not (hasattr(module, "inv_freq") and hasattr(module, "config") and hasattr(module, "attention_scaling")):
            continue
        fn = _rope_init_fn(module)
        device = module.inv_freq.device
        inv_freq, attention_scaling = fn(module.config)  # 5.16 deprecates `device`, 5.24 drops it
        with torch.no_grad():
            module.inv_freq.copy_(inv_freq.to(device=device, dtype=module.inv_freq.dtype))
            if hasattr(module, "original_inv_freq"):
                module.original_inv_freq.copy_(module.inv_freq)
        module.attention_scaling = attention_scaling
        count += 1
    return count


def with_rope(model_config, theta: float, positions: int):
    """A copy of the backend's model config (its flavors are shared by every spec it builds) that trains the default
    RoPE of `theta` over `positions`, whatever `--hf_model`'s config.json says."""
    model_config = copy.deepcopy(model_config)
    model_config._titan_injected_model_args = {
        **model_config._titan_injected_model_args,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "max_position_embeddings": positions,
    }
    return model_config


def apply() -> None:
    """Wrap HFTransformerModel.init_states once per process."""
    original = HFTransformerModel.init_states
    if getattr(original, "reinits_rotary_buffers", False):
        return

    def init_states(self, *args, **kwargs):
        original(self, *args, **kwargs)
        reinit_rotary_buffers(self.model)

    init_states.reinits_rotary_buffers = True
    init_states.upstream = original
    HFTransformerModel.init_states = init_states
