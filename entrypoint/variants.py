"""The variant table: the one place that says which torchtitan config each VARIANT runs.

Everything else (the launcher, the README, the tests) reads this table; the config
functions it names live in recipes/neuron_qwen3/config_registry.py.
"""

from dataclasses import dataclass

RECIPE_MODULE = "neuron_qwen3"
SCALES = ("full", "smoke", "bench")


@dataclass(frozen=True)
class Variant:
    name: str
    summary: str
    hf_repo: str  # the default MODEL: Hub repo of the full-scale model assets (tokenizer, config, weights)
    configs: dict  # scale -> config function in neuron_qwen3.config_registry
    family: str  # which Qwen3 models it trains (entrypoint/models.py): dense or moe
    any_model_config: str  # full scale, MODEL other than hf_repo: the config function that reads MODEL
    hf_config_arg: str | None = None  # full scale: the flag that must point at the assets folder's config.json


VARIANTS = {
    v.name: v
    for v in (
        Variant(
            name="v5",
            summary="Hugging Face Transformers v5 modeling backend, Qwen/Qwen3-4B-Instruct-2507",
            hf_repo="Qwen/Qwen3-4B-Instruct-2507",
            configs={"full": "v5_qwen3_4b", "smoke": "v5_qwen3_smoke", "bench": "v5_qwen3_bench"},
            family="dense",
            any_model_config="v5_qwen3",
            hf_config_arg="--hf_model",  # else AutoConfig asks the Hub for the repo id, offline too
        ),
        Variant(
            name="native",
            summary="torchtitan's native Qwen3 model spec, Qwen3-4B",
            hf_repo="Qwen/Qwen3-4B",
            configs={"full": "native_qwen3_4b", "smoke": "native_qwen3_smoke", "bench": "native_qwen3_bench"},
            family="dense",
            any_model_config="native_qwen3",
        ),
        Variant(
            name="nki_moe",
            summary="Qwen3-30B-A3B MoE, experts swapped for NKI kernels via torchtitan's override registry",
            hf_repo="Qwen/Qwen3-30B-A3B",
            configs={"full": "nki_moe_qwen3_30b_a3b", "smoke": "nki_moe_qwen3_smoke", "bench": "nki_moe_qwen3_bench"},
            family="moe",
            any_model_config="nki_moe_qwen3",
        ),
    )
}
DEFAULT_VARIANT = "native"
