"""What the generator takes from a run: its tokenizer and the tokens an answer stops at, and whether a round keeps
the weights gathered in a rank's memory. The run's samples (report/samples.py), GRPO's rollout (rl/) and the
offline command (__main__.py) share them; their prompts are read in data/prompts.py.
"""

import torch

from neuron_qwen3 import shapes
from neuron_qwen3.data.tokens import IM_END, chat_template
from neuron_qwen3.generate.plan import Plan, gathers_once


def tokenizer_of(config):
    """torchtitan's tokenizer of the folder whose chat template the run renders with (finish.py sets it)."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    return HuggingFaceTokenizer(
        tokenizer_path=getattr(config.dataloader, "tokenizer_folder", "") or config.hf_assets_path
    )


def stop_ids(tokenizer) -> set:
    """The tokens an answer ends at: the template's end of turn, and the tokenizer's end of text."""
    ids = {tokenizer.tokenizer.token_to_id(IM_END)}
    eos = chat_template(tokenizer.tokenizer_path)[1].get("eos_token")
    if eos:
        ids.add(tokenizer.tokenizer.token_to_id(eos))
    return ids - {None}


def itemsize_of(config) -> int:
    """Bytes per value of the weights FSDP gathers and the KV cache holds: the mixed-precision parameter dtype."""
    return torch.empty(0, dtype=getattr(torch, config.training.mixed_precision_param)).element_size()


def rank_memory_gib(config) -> float | None:
    """A rank's device memory, in a worker: a trn2 logical NeuronCore's, a CUDA device's own; None on CPU."""
    if config.device == "neuron":
        return shapes.NEURON_GIB_PER_CORE[config.neuron.logical_nc_config]
    if config.device == "cuda":
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30
    return None


def gathering(config, plan: Plan, memory_gib: float | None) -> tuple:
    """Whether the generator keeps the weights gathered for a round, the bytes that takes and the line saying so
    (generate/plan.py), for the run's model."""
    shape, itemsize = shapes.of_run(config), itemsize_of(config)
    working = plan.cache_bytes(shape.n_layers, shape.n_kv_heads, shape.head_dim, itemsize) + plan.prefill_bytes(
        shape.n_heads, shape.hidden_dim * max(1, shape.top_k), itemsize
    )
    return gathers_once(shape.parameters() * itemsize, shape.layer_parameters() * itemsize, working, memory_gib)
