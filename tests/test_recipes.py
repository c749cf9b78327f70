"""The recipes: every config the variant table names exists and carries what the article says.

Run: .venv/bin/python -m pytest tests/test_recipes.py
"""

import json
from pathlib import Path

import pytest

from conftest import REPO, RECIPES

from entrypoint.variants import RECIPE_MODULE, SCALES, VARIANTS
from torchtitan.config import ConfigManager

from neuron_qwen3 import config_registry

ALL_CONFIGS = [(v.name, scale, v.configs[scale]) for v in VARIANTS.values() for scale in SCALES]


@pytest.mark.parametrize("variant,scale,name", ALL_CONFIGS)
def test_article_command_parses_every_config(variant, scale, name):
    """`-m torchtitan.train --module neuron_qwen3 --config NAME` resolves, as in the article."""
    config = ConfigManager().parse_args(["--module", RECIPE_MODULE, "--config", name])
    assert config.model_spec is not None
    assert config.training.steps == 10


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_full_configs_follow_the_article(variant):
    config = getattr(config_registry, VARIANTS[variant].configs["full"])()
    assert config.training.local_batch_size == 1
    assert config.parallelism.data_parallel_shard_degree == -1
    assert config.hf_assets_path.endswith("assets/hf/" + VARIANTS[variant].hf_repo.split("/")[1])


def test_v5_uses_the_hub_model_and_transformers_backend():
    config = config_registry.v5_qwen3_4b()
    assert config.hf_model == "Qwen/Qwen3-4B-Instruct-2507" == VARIANTS["v5"].hf_repo
    assert config.model_spec.name == "transformers_modeling_backend"


def test_native_is_torchtitans_qwen3_4b():
    spec = config_registry.native_qwen3_4b().model_spec
    assert (spec.name, spec.flavor) == ("qwen3", "4B")
    assert spec.model.dim == 2560 and len(spec.model.layers) == 36


def test_nki_moe_enables_the_expert_override_at_every_scale():
    for name in VARIANTS["nki_moe"].configs.values():
        (entry,) = getattr(config_registry, name)().override.imports
        assert (entry if isinstance(entry, str) else entry[0]) == config_registry.NKI_EXPERTS_OVERRIDE
    assert config_registry.native_moe_qwen3_smoke().override.imports == []
    spec = config_registry.nki_moe_qwen3_30b_a3b().model_spec
    assert (spec.name, spec.flavor) == ("qwen3", "30B-A3B")


@pytest.mark.parametrize("accelerator", [False, True])
def test_the_cpu_bench_computes_the_experts_in_float32_like_the_rest_of_its_model(monkeypatch, accelerator):
    """bf16 matmuls run ~100x slower than fp32 on this AVX2 CPU, and the experts cast to bf16 by default; with an
    accelerator the bench keeps torchtitan's bf16 compute."""
    monkeypatch.setattr(config_registry, "_accelerator", lambda: accelerator)
    config = config_registry.nki_moe_qwen3_bench()
    if accelerator:
        assert config.override.imports == [config_registry.NKI_EXPERTS_OVERRIDE]
        assert config.training.mixed_precision_param == "bfloat16"
    else:
        assert config.override.imports == [(config_registry.NKI_EXPERTS_OVERRIDE, {"compute_dtype": "float32"})]
        assert config.training.mixed_precision_param == "float32"


@pytest.mark.parametrize("name", [v.configs["smoke"] for v in VARIANTS.values()])
def test_smoke_configs_use_only_bundled_assets(name):
    config = getattr(config_registry, name)()
    for path in (config.hf_assets_path, config.dataloader.dataset_path):
        assert Path(path).is_dir() and Path(path).is_relative_to(RECIPES), path
    assert config.dataloader.dataset == "c4_test"


def test_smoke_models_share_one_architecture():
    """native, nki_moe and v5 smoke models agree on the attention stack and the vocabulary."""
    hf = json.loads((config_registry.SMOKE_HF_MODEL / "config.json").read_text())
    s = config_registry.SMOKE
    assert (hf["hidden_size"], hf["num_hidden_layers"], hf["vocab_size"]) == (s["dim"], s["n_layers"], s["vocab_size"])
    assert (hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]) == (
        s["n_heads"], s["n_kv_heads"], s["head_dim"])
    assert hf["intermediate_size"] == s["hidden_dim"]


def test_bundled_tokenizer_fits_the_smoke_vocabulary():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(config_registry.SMOKE_TOKENIZER / "tokenizer.json"))
    assert tok.get_vocab_size() <= config_registry.SMOKE["vocab_size"]
    ids = tok.encode("The careful engineer trains the router near the river.").ids
    assert 0 < len(ids) < 20 and max(ids) < config_registry.SMOKE["vocab_size"]


def test_assets_are_small():
    size = sum(p.stat().st_size for p in (RECIPES / "neuron_qwen3" / "assets").rglob("*") if p.is_file())
    assert size < 4 * 2**20
