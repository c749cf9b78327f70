"""The v5 variant's trainer: the transformers backend's, with the run hooks and the project's Config sections.

In a module of its own because importing the transformers backend (it imports its transformers model at package
import) takes seconds that the native and nki_moe runs do not need; config_registry imports it only in the v5
config functions.
"""

from dataclasses import dataclass

from torchtitan.experiments.transformers_modeling_backend.configs import TransformersBackendConfig
from torchtitan.experiments.transformers_modeling_backend.trainer import HFTransformerTrainer

from neuron_qwen3.quirks import hf_rope_fix
from neuron_qwen3.settings import RunSettings
from neuron_qwen3.trainer import RunHooks


class Qwen3TransformersTrainer(RunHooks, HFTransformerTrainer):
    """The transformers backend's trainer (v5) with the run hooks."""

    @dataclass(kw_only=True, slots=True)
    class Config(TransformersBackendConfig, RunSettings):
        pass

    def __init__(self, config):
        hf_rope_fix.apply()  # the v5 variant trains with NaN loss without it; see hf_rope_fix.py
        super().__init__(config)
