"""INIT_FROM and EXPORT_DIR: Hugging Face safetensors in and out through torchtitan's own state-dict adapters.

Loading is torchtitan's: the launcher passes `--checkpoint.initial_load_path <abs> --checkpoint.initial_load_in_hf
--checkpoint.initial_load_model_only` and the checkpointer reads the folder through the model's adapter (the native
Qwen3 adapter, dense and MoE, or the transformers backend's prefix adapter). This module adds what 0.3.0 leaves out:

- `check_coverage`: every parameter of the model must survive `from_hf(to_hf(...))`. The Qwen3 adapter's `to_hf`
  skips keys it does not know without a word (upstream PR #3626): a load would leave those weights random and an
  export would drop them.
- `hf_compatible`: a run that loads or exports HF weights trains the function transformers computes; the MoE's
  auxiliary-loss-free routing bias (`load_balance_coeff`) has no Hugging Face counterpart, so it is switched off.
- `export`: torchtitan's last HF save fires only when `step == training.steps` (a run whose data ends early never
  exports), writes no config.json or tokenizer, and names its folder `step-N` inside `checkpoint.folder`, where a
  later run mistakes it for a resumable checkpoint. The export here runs after the training loop however it ended,
  gathers the full weights on rank 0 and writes a complete model folder at `--export.dir`, atomically.
"""

import contextlib
import json
import os
import shutil

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torchtitan.components.checkpoint import ModelWrapper
from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.tools.logging import logger

from neuron_qwen3.lora import is_adapter_key

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "chat_template.jinja", "added_tokens.json", "tokenizer.model")
MAX_SHARD = "5GB"  # the Hub's usual shard size; smaller models are one model.safetensors


class CoverageError(RuntimeError):
    """The adapter cannot map some of the model's weights to Hugging Face keys."""


def _adapter(trainer):
    spec = trainer.config.model_spec
    return spec.state_dict_adapter(trainer.model_config, trainer.config.hf_assets_path)


def uses_hf_weights(config) -> bool:
    return bool(config.checkpoint.initial_load_in_hf or config.export.dir)


def hf_compatible(config) -> None:
    """Switch off the MoE routing bias that Hugging Face's Qwen3-MoE does not have, when HF weights go in or out."""
    if not uses_hf_weights(config):
        return
    for layer in getattr(config.model_spec.model, "layers", None) or ():
        moe = getattr(layer, "moe", None)
        if moe is not None and moe.load_balance_coeff is not None:
            moe.load_balance_coeff = None


def check_coverage(trainer) -> None:
    """Raise unless every model weight has a Hugging Face key and comes back from it (on meta: no memory)."""
    if not uses_hf_weights(trainer.config):
        return
    names = {name: torch.empty(value.shape, dtype=value.dtype, device="meta")
             for name, value in ModelWrapper(trainer.model_parts).state_dict().items()
             if not is_adapter_key(name)}  # LoRA adapters: a PEFT file of their own (lora_io.py)
    adapter = _adapter(trainer)
    back = adapter.from_hf(adapter.to_hf(dict(names)))
    lost = sorted(set(names) - set(back))
    if lost:
        raise CoverageError(f"{type(adapter).__name__} has no Hugging Face key for {len(lost)} weights "
                            f"(first: {lost[0]}): they would load as random and be missing from an export")


# ---- config.json of the trained shape ----------------------------------------------------------------------


def native_hf_config(model_config, base: dict) -> dict:
    """The transformers config of a torchtitan Qwen3Model.Config (dense -> qwen3, MoE -> qwen3_moe), over `base`."""
    first = model_config.layers[0]
    attention, moe = first.attention, first.moe
    shape = dict(
        vocab_size=model_config.vocab_size, hidden_size=model_config.dim,
        num_hidden_layers=len(model_config.layers), num_attention_heads=attention.n_heads,
        num_key_value_heads=attention.n_kv_heads, head_dim=attention.head_dim,
        max_position_embeddings=attention.rope.max_seq_len,
        rope_parameters={"rope_type": "default", "rope_theta": attention.rope.theta},
        rms_norm_eps=model_config.norm.eps, tie_word_embeddings=model_config.enable_weight_tying,
        hidden_act="silu", attention_bias=False,
    )
    if moe is None:
        shape.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"],
                     intermediate_size=first.feed_forward.w1.out_features)
    else:
        router = moe.router
        assert router.score_func == "softmax" and router.route_scale == 1.0, "not a Qwen3-MoE router"
        shape.update(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_experts=moe.num_experts,
                     num_experts_per_tok=router.top_k, norm_topk_prob=router.route_norm,
                     moe_intermediate_size=moe.routed_experts.inner_experts.hidden_dim,
                     decoder_sparse_step=1, mlp_only_layers=[])
    if "max_position_embeddings" in base:  # torchtitan sizes its RoPE cache to seq_len; the source's limit stands
        del shape["max_position_embeddings"]
    return {**base, **shape}


def hf_config(trainer, base: dict) -> dict:
    model = trainer.model_parts[0]
    if hasattr(model, "model") and hasattr(model.model, "config"):  # the transformers backend: its own config
        return {**base, **model.model.config.to_dict()}
    return native_hf_config(trainer.model_config, base)


def _read_json(path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


# ---- the export --------------------------------------------------------------------------------------------


def full_state_dict(trainer, keep=lambda key: True) -> dict:
    """The model's state dict as the checkpointer sees it (torchtitan's ModelWrapper: fused QKV already split into
    wq/wk/wv), each sharded tensor gathered in turn: every rank takes part, rank 0 keeps them on CPU. `keep`: which
    keys to gather (every rank must pass the same)."""
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    states = {}
    for key, value in ModelWrapper(trainer.model_parts).state_dict().items():
        if not keep(key):
            continue
        full = value.full_tensor() if isinstance(value, DTensor) else value
        if rank0:
            states[key] = full.detach().to("cpu")
    return states


def companions(source: str | None, assets: str | None) -> list:
    """Files copied next to the weights: generation_config.json from the source model (else the assets), and the
    tokenizer files of one folder, the source model's when it has a tokenizer, else the tokenizer trained with."""
    def has(folder, name):
        return bool(folder) and os.path.isfile(os.path.join(folder, name))

    generation = next((folder for folder in (source, assets) if has(folder, "generation_config.json")), None)
    tokenizer = source if has(source, "tokenizer_config.json") else assets
    found = [os.path.join(generation, "generation_config.json")] if generation else []
    return found + [os.path.join(tokenizer, name) for name in TOKENIZER_FILES if has(tokenizer, name)]


def own_storage(tensor):
    """`tensor`, copied when it views a larger storage: the MoE adapter's to_hf hands out each expert as a slice of
    the stacked w1/w2/w3, and safetensors refuses tensors that share storage (a float32 export does not copy)."""
    tensor = tensor.contiguous()
    return tensor.clone() if tensor.untyped_storage().nbytes() != tensor.nbytes else tensor


@contextlib.contextmanager
def staged(target: str):
    """A folder beside `target` under a temporary name, renamed into place once the block has filled it."""
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, f".{os.path.basename(target)}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    yield staging
    if os.path.exists(target):  # a rerun replaces its earlier export; the old one is gone only once this is whole
        old = os.path.join(parent, f".{os.path.basename(target)}.old-{os.getpid()}")
        os.rename(target, old)
        os.rename(staging, target)
        shutil.rmtree(old)
    else:
        os.rename(staging, target)


def fill_folder(folder: str, tensors: dict, config: dict, files: list) -> None:
    from huggingface_hub import save_torch_state_dict

    save_torch_state_dict(tensors, folder, max_shard_size=MAX_SHARD)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    for path in files:
        shutil.copyfile(path, os.path.join(folder, os.path.basename(path)))


def folder_contents(trainer, states: dict) -> tuple[dict, dict, list]:
    """(Hugging Face tensors in the export dtype, config.json, companion files) of a gathered state dict."""
    dtype = TORCH_DTYPE_MAP[trainer.config.export.dtype]
    tensors = {key: own_storage(value.to(dtype) if value.is_floating_point() else value)
               for key, value in _adapter(trainer).to_hf(states).items()}
    source = trainer.config.checkpoint.initial_load_path or None
    base = _read_json(os.path.join(source, "config.json")) if source else {}
    config = {**hf_config(trainer, base), "torch_dtype": str(dtype).removeprefix("torch."),
              "dtype": str(dtype).removeprefix("torch.")}
    return tensors, config, companions(source, trainer.config.hf_assets_path)


def export(trainer) -> str | None:
    """`--export.dir`, if set: the trained model as a Hugging Face folder, written by rank 0; every rank returns
    after it is complete. The adapter's coverage was checked before training (RunHooks.train)."""
    target = trainer.config.export.dir
    if not target:
        return None
    target = os.path.abspath(target)
    states = full_state_dict(trainer)
    if not dist.is_initialized() or dist.get_rank() == 0:
        tensors, config, files = folder_contents(trainer, states)
        with staged(target) as staging:
            fill_folder(staging, tensors, config, files)
        logger.info(f"Exported the trained model ({len(tensors)} tensors, {config['dtype']}) to {target}")
    if dist.is_initialized():
        dist.barrier()
    return target
