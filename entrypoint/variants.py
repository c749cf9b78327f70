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
    """Its config functions are named `<name>_qwen3_<flavor or scale>`, as config_registry.py defines them."""

    name: str
    summary: str
    hf_repo: str  # the default MODEL: Hub repo of the full-scale model assets (tokenizer, config, weights)
    hf_config_arg: str | None = None  # full scale: the flag that must point at the assets folder's config.json

    @property
    def model_config(self) -> str:
        """Full scale, any MODEL: the config function of its flavor, `{flavor}` filled in."""
        return f"{self.name}_qwen3_{{flavor}}"

    @property
    def configs(self) -> dict:
        """Scale (and bench_cpu, bench on a CPU host) -> config function; full: the default MODEL's."""
        twins = {scale: f"{self.name}_qwen3_{scale}" for scale in ("smoke", "bench", "bench_cpu")}
        return {"full": self.config_for(self.hf_repo), **twins}

    def config_for(self, model: str) -> str:
        """The config function that trains `model` (a Qwen3 Hub id, QWEN3_ID) at full scale."""
        flavor = QWEN3_ID.fullmatch(model)["flavor"]
        return self.model_config.format(flavor=flavor.lower().replace(".", "_").replace("-", "_"))


VARIANTS = {
    v.name: v
    for v in (
        Variant(
            "v5",
            "Hugging Face Transformers v5 modeling backend, Qwen/Qwen3-4B-Instruct-2507",
            "Qwen/Qwen3-4B-Instruct-2507",
            hf_config_arg="--hf_model",
        ),  # else AutoConfig asks the Hub for the repo id, offline too
        Variant("native", "torchtitan's native Qwen3 model spec, Qwen3-4B", "Qwen/Qwen3-4B"),
        Variant(
            "nki_moe",
            "Qwen3-30B-A3B MoE, experts swapped for NKI kernels via torchtitan's override registry",
            "Qwen/Qwen3-30B-A3B",
        ),
    )
}
DEFAULT_VARIANT = "native"
