"""INIT_FROM and EXPORT_DIR: Hugging Face safetensors in and out through torchtitan's own state-dict adapters.

The launcher passes `--checkpoint.initial_load_path <abs> --checkpoint.initial_load_in_hf
--checkpoint.initial_load_model_only`, and the folder is read through the model's adapter (the native Qwen3
adapter, dense and MoE, or the transformers backend's prefix adapter). This module adds what 0.3.0 leaves out:

- `initial_load`: torchtitan's initial HF load gathers every layer's attention weights whole on every rank; it is
  done by load.py instead, every rank reading its own rows (torchtitan's still loads a TP or EP model).

- `check_coverage`: every parameter of the model must survive `from_hf(to_hf(...))`. The Qwen3 adapter's `to_hf`
  skips keys it does not know without a word (upstream PR #3626): a load would leave those weights random and an
  export would drop them.
- `hf_compatible`: a run that loads or exports HF weights trains the function transformers computes; the MoE's
  auxiliary-loss-free routing bias (`load_balance_coeff`) has no Hugging Face counterpart, so it is switched off.
- `export`: torchtitan's last HF save fires only when `step == training.steps` (a run whose data ends early never
  exports), writes no config.json or tokenizer, names its folder `step-N` inside `checkpoint.folder`, where a
  later run mistakes it for a resumable checkpoint, and gathers the whole model on rank 0 first. The export here
  runs after the training loop however it ended and streams (shards.py: every rank writes its own rows in place,
  in the Hub's sharded layout) into a complete model folder at `--export.dir`, renamed into place.
"""

import json
import os
import shutil
import time

from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.tools.logging import logger

from neuron_qwen3.hf import load, shards, write
from neuron_qwen3.lora.adapters import is_adapter_key
from neuron_qwen3.hf.shards import CoverageError, ExportError  # noqa: F401 (raised from here too)

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "added_tokens.json",
    "tokenizer.model",
)


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


def complete_step(checkpointer) -> int:
    """The newest complete checkpoint in checkpoint.folder, which torchtitan resumes instead of the initial load;
    -1: none."""
    return checkpointer._find_load_step() if os.path.isdir(checkpointer.folder) else -1


def load_hf(trainer, folder: str, keep=lambda key: True) -> bool:
    """`folder`'s safetensors into the model (the keys `keep` accepts), every rank its own rows (load.py); False,
    nothing read, for a model with weights not held as whole rows. Every rank must call it."""
    begin = time.monotonic()
    if not load.load(trainer.model_parts, trainer.checkpointer.sd_adapter, folder, keep):
        return False
    logger.info(
        f"Loaded the Hugging Face weights of {folder} in {time.monotonic() - begin:.2f} s, every rank its "
        "own rows (torchtitan's checkpointer, with no checkpoint to resume, then calls it a fresh start)"
    )
    return True


def initial_load(trainer) -> None:
    """Before torchtitan's `checkpointer.load`: its initial HF load (INIT_FROM) done by `load_hf`, and then switched
    off, unless a complete checkpoint is there to resume (it wins, as in torchtitan) or the load is quantized."""
    checkpointer = trainer.checkpointer  # without --checkpoint.enable, a manager with no initial load at all
    if (
        not (checkpointer.enable and checkpointer.initial_load_in_hf and checkpointer.initial_load_path)
        or checkpointer.initial_load_in_hf_quantized
        or complete_step(checkpointer) != -1
    ):
        return
    if load_hf(trainer, checkpointer.initial_load_path):
        checkpointer.initial_load_path, checkpointer.initial_load_in_hf = None, False


def check_coverage(trainer) -> None:
    """Raise unless every model weight has a Hugging Face key and comes back from it (on meta: no memory)."""
    if not uses_hf_weights(trainer.config):
        return
    names = shards.meta_shapes(
        shards.state_dict_pieces(  # a layer at a time; LoRA's adapters: lora/folders.py
            trainer.model_parts, keep=lambda key: not is_adapter_key(key)
        )
    )
    adapter = _adapter(trainer)
    back = adapter.from_hf(adapter.to_hf(dict(names)))
    lost = sorted(set(names) - set(back))
    if lost:
        raise CoverageError(
            f"{type(adapter).__name__} has no Hugging Face key for {len(lost)} weights "
            f"(first: {lost[0]}): they would load as random and be missing from an export"
        )


# ---- config.json of the trained shape ----------------------------------------------------------------------


def native_hf_config(model_config, base: dict) -> dict:
    """The transformers config of a torchtitan Qwen3Model.Config (dense -> qwen3, MoE -> qwen3_moe), over `base`."""
    first = model_config.layers[0]
    attention, moe = first.attention, first.moe
    shape = dict(
        vocab_size=model_config.vocab_size,
        hidden_size=model_config.dim,
        num_hidden_layers=len(model_config.layers),
        num_attention_heads=attention.n_heads,
        num_key_value_heads=attention.n_kv_heads,
        head_dim=attention.head_dim,
        max_position_embeddings=attention.rope.max_seq_len,
        rope_parameters={"rope_type": "default", "rope_theta": attention.rope.theta},
        rms_norm_eps=model_config.norm.eps,
        tie_word_embeddings=model_config.enable_weight_tying,
        hidden_act="silu",
        attention_bias=False,
    )
    if moe is None:
        shape.update(
            model_type="qwen3", architectures=["Qwen3ForCausalLM"], intermediate_size=first.feed_forward.w1.out_features
        )
    else:
        router = moe.router
        assert router.score_func == "softmax" and router.route_scale == 1.0, "not a Qwen3-MoE router"
        experts = "num_local_experts" if "num_local_experts" in base else "num_experts"  # transformers 5's name
        shape.update(
            model_type="qwen3_moe",
            architectures=["Qwen3MoeForCausalLM"],
            **{experts: moe.num_experts},
            num_experts_per_tok=router.top_k,
            norm_topk_prob=router.route_norm,
            moe_intermediate_size=moe.routed_experts.inner_experts.hidden_dim,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    if "max_position_embeddings" in base:  # torchtitan sizes its RoPE cache to seq_len; the source's limit stands
        del shape["max_position_embeddings"]
    return {**base, **shape}


def hf_config(trainer, base: dict) -> dict:
    model = trainer.model_parts[0]
    if hasattr(model, "model") and hasattr(model.model, "config"):  # the transformers backend: its own config
        from transformers import PretrainedConfig

        # torchtitan's config there is also a dataclass whose to_dict() holds none of the shape: transformers' own
        # to_dict, kept to the fields of the model's config class (no torchtitan bookkeeping)
        fields = set(model.model.config_class().to_dict())
        own = {k: v for k, v in PretrainedConfig.to_dict(model.model.config).items() if k in fields}
        return {
            **base,
            **own,
            "model_type": model.model.config_class.model_type,
            "architectures": [type(model.model).__name__],
        }
    return native_hf_config(trainer.model_config, base)


def _read_json(path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def model_config_json(trainer, source: str | None, dtype) -> dict:
    """config.json of the trained model over the source's (`source`: the INIT_FROM folder, or None), its dtype
    under the name the source uses (transformers 4 `torch_dtype`, 5 `dtype`; both without a source)."""
    base = _read_json(os.path.join(source, "config.json")) if source else {}
    keys = [key for key in ("torch_dtype", "dtype") if key in base] or ["torch_dtype", "dtype"]
    return {**hf_config(trainer, base), **dict.fromkeys(keys, str(dtype).removeprefix("torch."))}


def companions(source: str | None, assets: str | None) -> list:
    """Files copied next to the weights: generation_config.json from the source model (else the assets), and the
    tokenizer files of one folder, the source model's when it has a tokenizer, else the tokenizer trained with."""

    def has(folder, name):
        return bool(folder) and os.path.isfile(os.path.join(folder, name))

    generation = next((folder for folder in (source, assets) if has(folder, "generation_config.json")), None)
    tokenizer = source if has(source, "tokenizer_config.json") else assets
    found = [os.path.join(generation, "generation_config.json")] if generation else []
    return found + [os.path.join(tokenizer, name) for name in TOKENIZER_FILES if has(tokenizer, name)]


def fill_folder(folder: str, config: dict, files: list) -> None:
    """What a model folder holds besides its weights: `config` as config.json, and copies of `files`."""
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    for path in files:
        shutil.copyfile(path, os.path.join(folder, os.path.basename(path)))


def export(trainer) -> str | None:
    """`--export.dir`, if set: the trained model as a Hugging Face folder (safetensors of at most
    `--export.max_shard_mb` each and their index, config.json, generation config, tokenizer). Every rank must call
    it; each returns once the folder is in place. On a failure the earlier export is left as it was and every rank
    raises ExportError. The adapter's coverage was checked before training (RunHooks.train)."""
    settings = trainer.config.export
    if not settings.dir:
        return None
    target, dtype = os.path.abspath(settings.dir), TORCH_DTYPE_MAP[settings.dtype]
    source = trainer.config.checkpoint.initial_load_path or None
    ranks = write.Ranks()
    try:
        with write.staged(ranks, target) as staging:
            layout = write.write_model(
                ranks,
                staging,
                _adapter(trainer),
                shards.state_dict_pieces(trainer.model_parts),
                dtype,
                settings.max_shard_mb * 10**6,
            )
            if ranks.rank == 0:
                fill_folder(
                    staging,
                    model_config_json(trainer, source, dtype),
                    companions(source, trainer.config.hf_assets_path),
                )
    finally:
        ranks.close()
    logger.info(
        f"Exported the trained model ({sum(len(u.entries) for u in layout.units)} tensors, {dtype}, "
        f"{len(layout.files)} files, {len(ranks.writers)} writing ranks) to {target}"
    )
    return target
