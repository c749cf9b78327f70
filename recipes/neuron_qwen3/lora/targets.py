"""Which modules LoRA adapts, and what is wrong with the LoRA settings before any model exists: the pre-launch pass
checks them without building the adapters.
"""

from torchtitan.models.common.moe import GroupedExperts

from neuron_qwen3.settings import Lora

# LoRA targets, in the Hugging Face module names PEFT's `target_modules` uses, per model family. Qwen3-MoE has no
# dense MLP: its routed experts are two 3-D parameters in transformers (PEFT's `target_parameters`).
TARGETS = {
    "dense": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "moe": ("q_proj", "k_proj", "v_proj", "o_proj", "experts.gate_up_proj", "experts.down_proj"),
}
DEFAULT_TARGETS = {"dense": TARGETS["dense"], "moe": TARGETS["moe"][:4]}  # MoE: the experts when asked
FAMILY_NAMES = {"dense": "dense", "moe": "MoE"}
NEEDS_INIT_FROM = (
    "LORA_RANK is set but INIT_FROM is not: LoRA trains adapters over a model's weights, not over a "
    "random init (set INIT_FROM to a Hugging Face model folder, or `hub`)"
)


class LoRAError(ValueError):
    """A LoRA setting the model cannot take; its message is one line."""


def targets_of(settings: Lora, family: str) -> tuple[str, ...]:
    """The Hugging Face names adapted: `--lora.targets`, else the model family's default."""
    return settings.names or DEFAULT_TARGETS[family]


def target_problems(settings: Lora, family: str) -> list[str]:
    """What is wrong with the targets for a model family, one line each ([]: nothing); the rank's, alpha's and
    dropout's ranges are the section's own (settings.Lora)."""
    targets = targets_of(settings, family)
    problems = []
    if len(set(targets)) != len(targets):
        problems.append(f"LORA_TARGETS={','.join(targets)} names a target twice")
    unknown = [name for name in targets if name not in TARGETS[family]]
    if unknown:
        problems.append(
            f"LORA_TARGETS: {', '.join(unknown)} matches no module of a Qwen3 of the "
            f"{FAMILY_NAMES[family]} family (its targets: {', '.join(TARGETS[family])})"
        )
    if settings.dropout and any(name.startswith("experts.") for name in targets):
        problems.append(
            f"LORA_DROPOUT={settings.dropout:g} with expert targets: PEFT's LoRA on expert parameters "
            "has no dropout (use LORA_DROPOUT=0, or leave the experts out)"
        )
    return problems


def problems(config, settings: Lora) -> list[str]:
    """The problems (one line each) that the settings show against the config before any model exists: no initial
    load, a target the model family lacks, a parallelism LoRA here does not shard."""
    loads = config.checkpoint.initial_load_path and config.checkpoint.initial_load_in_hf
    parallel = config.parallelism
    degrees = {
        "tensor": parallel.tensor_parallel_degree,
        "expert": parallel.expert_parallel_degree,
        "pipeline": parallel.pipeline_parallel_degree,
    }
    unsharded = [f"{name} parallelism degree {degree}" for name, degree in degrees.items() if degree > 1]
    return (
        ([] if loads else [NEEDS_INIT_FROM])
        + target_problems(settings, family_of(config.model_spec.model))
        + ([f"LoRA here shards with FSDP only; this run has {', '.join(unsharded)}"] if unsharded else [])
    )


def family_of(model_config) -> str:
    """dense or moe: which of TARGETS a model config takes (v5's transformers config: dense)."""
    return "moe" if next(model_config.traverse(GroupedExperts.Config, recurse=True), None) else "dense"
