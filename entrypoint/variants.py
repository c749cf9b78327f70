"""The variant table: the one place that says which torchtitan config each VARIANT runs.

The launcher knows the recipes by these names only (recipes/neuron_qwen3/config_registry.py defines them); the
README, `--list` and the tests read this table.
"""

import re
from dataclasses import dataclass

RECIPE_MODULE = "neuron_qwen3"
SCALES = ("full", "smoke", "bench")
# A Qwen3 Hub id: Qwen/Qwen3-<flavor>[-<form>], e.g. Qwen/Qwen3-30B-A3B-Instruct-2507 -> flavor 30B-A3B.
QWEN3_ID = re.compile(r"Qwen/Qwen3-(?P<flavor>\d+(\.\d+)?B(-A\d+(\.\d+)?B)?)(-[A-Za-z0-9][A-Za-z0-9.-]*)?")


@dataclass(frozen=True)
class Variant:
    name: str
    summary: str
    hf_repo: str  # the default MODEL: Hub repo of the full-scale model assets (tokenizer, config, weights)
    configs: dict  # scale (and bench_cpu, bench on a CPU host) -> config function
    model_config: str  # full scale, any MODEL: the config function of its flavor, `{flavor}` filled in
    hf_config_arg: str | None = None  # full scale: the flag that must point at the assets folder's config.json

    def config_for(self, model: str) -> str:
        """The config function that trains `model` (a Qwen3 Hub id, QWEN3_ID) at full scale."""
        flavor = QWEN3_ID.fullmatch(model)["flavor"]
        return self.model_config.format(flavor=flavor.lower().replace(".", "_").replace("-", "_"))


VARIANTS = {
    v.name: v
    for v in (
        Variant(
            name="v5",
            summary="Hugging Face Transformers v5 modeling backend, Qwen/Qwen3-4B-Instruct-2507",
            hf_repo="Qwen/Qwen3-4B-Instruct-2507",
            configs={"full": "v5_qwen3_4b", "smoke": "v5_qwen3_smoke", "bench": "v5_qwen3_bench",
                     "bench_cpu": "v5_qwen3_bench_cpu"},
            model_config="v5_qwen3_{flavor}",
            hf_config_arg="--hf_model",  # else AutoConfig asks the Hub for the repo id, offline too
        ),
        Variant(
            name="native",
            summary="torchtitan's native Qwen3 model spec, Qwen3-4B",
            hf_repo="Qwen/Qwen3-4B",
            configs={"full": "native_qwen3_4b", "smoke": "native_qwen3_smoke", "bench": "native_qwen3_bench",
                     "bench_cpu": "native_qwen3_bench_cpu"},
            model_config="native_qwen3_{flavor}",
        ),
        Variant(
            name="nki_moe",
            summary="Qwen3-30B-A3B MoE, experts swapped for NKI kernels via torchtitan's override registry",
            hf_repo="Qwen/Qwen3-30B-A3B",
            configs={"full": "nki_moe_qwen3_30b_a3b", "smoke": "nki_moe_qwen3_smoke", "bench": "nki_moe_qwen3_bench",
                     "bench_cpu": "nki_moe_qwen3_bench_cpu"},
            model_config="nki_moe_qwen3_{flavor}",
        ),
    )
}
DEFAULT_VARIANT = "native"
