"""The DPO reference model: what the policy's log-probabilities are measured against.

- `AdaptersOff`: with LoRA, the policy itself with every adapter's scale at 0 for the reference pass: the frozen
  base, with no second copy (TRL's reference for a PEFT model).
- `Frozen`: a second model of the same architecture, built and sharded as the policy is, loaded from a Hugging Face
  folder (INIT_FROM's weights, or DPO_REFERENCE's: TRL's `ref_model`), with no gradient and no optimizer state.
"""

import contextlib
import time

import torch
from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.tools import utils
from torchtitan.tools.logging import logger

from neuron_qwen3.hf import load
from neuron_qwen3.lora import adapters as lora_adapters
from neuron_qwen3.preference.dpo import logits_of, token_logps


class AdaptersOff:
    def __init__(self, model):
        self.model = model
        self.adapters = lora_adapters.adapters(model)
        assert self.adapters, "the adapters-off reference needs a model with LoRA adapters"

    @contextlib.contextmanager
    def _off(self):
        scales = [adapter.scale for adapter in self.adapters]
        for adapter in self.adapters:
            adapter.scale = 0.0
        try:
            yield
        finally:
            for adapter, scale in zip(self.adapters, scales):
                adapter.scale = scale

    def token_logps(self, inputs, labels, extra: dict) -> torch.Tensor:
        with self._off():
            return token_logps(logits_of(self.model, self.model(inputs, **extra)), labels)


class Frozen:
    def __init__(self, trainer, folder: str):
        begin = time.monotonic()
        config = trainer.config
        with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]):
            model = trainer.model_config.build()
        model = config.model_spec.parallelize_fn(
            model, parallel_dims=trainer.parallel_dims, training=config.training, parallelism=config.parallelism,
            compile_config=config.compile, ac_config=config.activation_checkpoint, dump_folder=config.dump_folder)
        model.to_empty(device=trainer.device)
        with torch.no_grad():
            model.init_weights(buffer_device=None)  # the buffers (RoPE); the weights come from the folder
        for param in model.parameters():
            param.requires_grad_(False)
        model.eval()
        keep = lambda key: not lora_adapters.is_adapter_key(key)  # noqa: E731 (a LoRA run's wrapper adds adapters)
        if not load.load([model], trainer.checkpointer.sd_adapter, folder, keep):
            raise ValueError(f"the DPO reference {folder}: its weights are not held as whole rows on every rank")
        self.model = model
        logger.info(f"DPO reference: {folder} loaded in {time.monotonic() - begin:.2f} s, sharded as the policy")

    def token_logps(self, inputs, labels, extra: dict) -> torch.Tensor:
        return token_logps(logits_of(self.model, self.model(inputs, **extra)), labels)
