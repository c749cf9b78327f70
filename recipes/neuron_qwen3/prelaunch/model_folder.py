"""The pre-launch pass's model-folder checks: the shape and RoPE the run trains, against an INIT_FROM or
DPO_REFERENCE folder read as transformers reads it (its config.json, every safetensors header)."""

import os

from neuron_qwen3 import shapes


def trained_shape(config) -> shapes.Shape | None:
    """The shape the run trains: the native model config, or the v5 model's config.json (None: not readable)."""
    if hasattr(config.model_spec.model, "layers"):
        return shapes.of_model_config(config.model_spec.model)
    try:
        from transformers import AutoConfig

        return shapes.of_model_config(AutoConfig.from_pretrained(config.hf_model))
    except (OSError, ValueError):
        return None


def trained_theta(config) -> float | None:
    """The rope_theta the run trains (finish.configure_rope set it): the native model config's, or what the v5
    model's config.json gets (None: not readable)."""
    from neuron_qwen3.hf import rope

    model = config.model_spec.model
    if hasattr(model, "layers"):
        return model.layers[0].attention.rope.theta
    injected = getattr(model, "_titan_injected_model_args", {}).get("rope_parameters")
    found = injected or rope.of_folder(config.hf_model, "--hf_model")
    return None if found is None else (found["rope_theta"] if injected else found.theta)


def reference_rope(source: str, config) -> list:
    """DPO_REFERENCE's weights run in the policy's architecture, its RoPE included: a folder of another is refused."""
    from neuron_qwen3.hf import rope

    try:
        theirs, ours = rope.of_folder(source, "DPO_REFERENCE"), trained_theta(config)
    except rope.RopeError as error:
        return [str(error)]
    if theirs is None or ours is None or theirs.theta == ours:
        return []
    return [f"DPO_REFERENCE={source!r} has rope_theta={theirs.theta:g} but the run trains rope_theta={ours:g}"]


# Architecture fields of config.json that fix the trained shape, in the order a mismatch is named.
SHAPE_FIELDS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "tie_word_embeddings",
)


def init_from(config, shape: shapes.Shape | None, resume_step) -> tuple[list, list]:
    """The INIT_FROM folder read as transformers reads it (its config.json, every safetensors header) against the
    shape the run trains: the first field that differs is named."""
    source = config.checkpoint.initial_load_path
    if not source or not config.checkpoint.initial_load_in_hf:
        return [], []
    if resume_step is not None:
        return [], [
            f"INIT_FROM is ignored: {config.checkpoint.folder} holds a complete checkpoint (step "
            f"{resume_step}), and the run resumes from it"
        ]
    return hf_folder("INIT_FROM", source, shape), []


def hf_folder(name: str, source: str, shape: shapes.Shape | None) -> list:
    """Problems of a Hugging Face model folder that the run loads as a model of `shape` (`name`: the variable)."""
    from safetensors import SafetensorError, safe_open
    from transformers import AutoConfig

    if not os.path.isdir(source):
        return [f"{name}={source!r}: no such folder"]
    try:
        found = AutoConfig.from_pretrained(source)
        weights = sorted(file for file in os.listdir(source) if file.endswith(".safetensors"))
        if not weights:
            return [f"{name}={source!r}: {source} has no *.safetensors weights"]
        for file in weights:
            with safe_open(os.path.join(source, file), "pt"):
                pass
    except (OSError, ValueError, SafetensorError) as error:  # no or bad config.json, a bad safetensors header
        return [f"{name}={source!r}: {str(error).strip().splitlines()[0]}"]
    if shape is None:
        return []
    trained = shapes.hf_config(shape)
    try:
        have = shapes.hf_config(shapes.of_model_config(found))
    except AttributeError:  # not a Qwen3 config: no such attribute
        have = {}
    have["model_type"] = found.model_type
    for field in SHAPE_FIELDS:
        if field in trained and have.get(field) != trained[field]:
            return [f"{name}={source!r} has {field}={have.get(field)!r} but the run trains {field}={trained[field]!r}"]
    return []
