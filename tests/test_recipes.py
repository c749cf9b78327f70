"""The recipes: every config the variant table names exists and carries what the article says.

Run: .venv/bin/python -m pytest tests/test_recipes.py
"""

from pathlib import Path

import pytest

from conftest import RECIPES

from entrypoint import contract, plan
from entrypoint.variants import RECIPE_MODULE, VARIANTS
from torchtitan.config import ConfigManager

from neuron_qwen3 import config_registry, finish, shapes

ALL_CONFIGS = [(v.name, scale, name) for v in VARIANTS.values() for scale, name in v.configs.items()]


@pytest.mark.parametrize("variant,scale,name", ALL_CONFIGS)
def test_article_command_parses_every_config(variant, scale, name):
    """`-m torchtitan.train --module neuron_qwen3 --config NAME` resolves, as in the article."""
    config = ConfigManager().parse_args(["--module", RECIPE_MODULE, "--config", name])
    assert config.model_spec is not None
    assert config.training.steps == 10
    assert (config.report.variant, config.report.scale.replace("bench_cpu", "bench"), config.report.config) == (
        variant,
        scale.replace("bench_cpu", "bench"),
        name,
    )  # summary.json names them
    assert type(config).__qualname__ == (
        "Qwen3TransformersTrainer.Config" if variant == "v5" else "Qwen3Trainer.Config"
    )  # config.build() builds the hooked trainer


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


def test_every_v5_config_masks_attention_per_document():
    """Packed documents restart their positions; with the backend's default causal mask a document would attend to
    the ones before it, and v5 would train another function than native (tests/test_data_packed_loss.py)."""
    names = [name for name in dir(config_registry) if name.startswith("v5_qwen3_")]
    assert len(names) > 3
    for name in names:
        assert getattr(config_registry, name)().model_spec.model.attn_mask_type == "block_causal", name


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


def test_the_cpu_bench_computes_the_experts_in_float32_like_the_rest_of_its_model():
    """bf16 matmuls run ~100x slower than fp32 on this AVX2 CPU, and the experts cast to bf16 by default; with an
    accelerator the bench keeps torchtitan's bf16 compute."""
    config = config_registry.nki_moe_qwen3_bench()
    assert config.override.imports == [config_registry.NKI_EXPERTS_OVERRIDE]
    assert config.training.mixed_precision_param == "bfloat16" and config.training.seq_len == 4096
    config = config_registry.nki_moe_qwen3_bench_cpu()
    assert config.override.imports == [(config_registry.NKI_EXPERTS_OVERRIDE, {"compute_dtype": "float32"})]
    assert config.training.mixed_precision_param == "float32" and config.training.seq_len == 2048


@pytest.mark.parametrize("name", [v.configs["smoke"] for v in VARIANTS.values()])
def test_smoke_configs_use_only_bundled_assets(name):
    config = getattr(config_registry, name)()
    for path in (config.hf_assets_path, config.dataloader.source):
        assert Path(path).is_dir() and Path(path).is_relative_to(RECIPES), path


def test_smoke_models_share_one_architecture():
    """native, nki_moe and v5 smoke models agree on the attention stack and the vocabulary."""
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(config_registry.HF_MODEL["smoke"])
    native = shapes.of_model_config(config_registry.native_qwen3_smoke().model_spec.model)
    assert shapes.of_model_config(hf) == native == shapes.SMOKE
    moe = shapes.of_model_config(config_registry.nki_moe_qwen3_smoke().model_spec.model)
    assert (moe.n_layers, moe.n_heads, moe.n_kv_heads, moe.head_dim, moe.vocab_size) == (
        native.n_layers,
        native.n_heads,
        native.n_kv_heads,
        native.head_dim,
        native.vocab_size,
    )


def test_bundled_tokenizer_fits_the_smoke_vocabulary():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(config_registry.SMOKE_TOKENIZER / "tokenizer.json"))
    assert tok.get_vocab_size() <= shapes.SMOKE.vocab_size
    ids = tok.encode("The careful engineer trains the router near the river.").ids
    assert 0 < len(ids) < 20 and max(ids) < shapes.SMOKE.vocab_size


def test_assets_are_small():
    size = sum(p.stat().st_size for p in (RECIPES / "neuron_qwen3" / "assets").rglob("*") if p.is_file())
    assert size < 4 * 2**20


MODEL_RUNS = [
    (variant, model)
    for model, flavor in shapes.MODELS.items()
    for variant in VARIANTS
    if (variant == "nki_moe") == (shapes.FLAVORS[flavor].family == "moe")
]


@pytest.mark.parametrize("variant, model", MODEL_RUNS, ids=[f"{v}-{m}" for v, m in MODEL_RUNS])
def test_every_model_the_launcher_runs_names_its_variant_and_scale(variant, model):
    """summary.json's variant, scale and config for a `MODEL=` run: the config the plan picks says them."""
    settings = contract.parse({"VARIANT": variant, "SCALE": "full", "MODEL": model})
    name = plan.config_for(settings, plan.model_for(settings), "cpu")
    report = getattr(config_registry, name)().report
    assert (report.variant, report.scale, report.config) == (variant, "full", name)


def parsed(name, *flags):
    return ConfigManager().parse_args(["--module", RECIPE_MODULE, "--config", name, *flags])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_full_scale_on_cpu_computes_in_float32_and_says_so(variant):
    """torchtitan's bf16 FSDP compute (and the nki_moe experts' own bf16 cast) is emulated on a CPU: the trainer's
    device set-up makes a full-scale config float32 there, for the launcher and stock torchtitan.train alike."""
    config = parsed(VARIANTS[variant].configs["full"])
    line = finish.cpu_float32(config, "cpu")
    assert line.startswith("precision: float32") and config.training.mixed_precision_param == "float32"
    experts = [entry for entry in config.override.imports if entry != finish.NKI_EXPERTS]
    assert experts == ([(finish.NKI_EXPERTS, {"compute_dtype": "float32"})] if variant == "nki_moe" else [])
    assert ("nki_moe experts" in line) == (variant == "nki_moe")


@pytest.mark.parametrize(
    "name, kind, flags",
    [
        ("nki_moe_qwen3_30b_a3b", "cuda", ()),
        ("nki_moe_qwen3_30b_a3b", "neuron", ()),
        ("nki_moe_qwen3_smoke", "cpu", ()),
        ("nki_moe_qwen3_bench", "cpu", ()),
        ("nki_moe_qwen3_30b_a3b", "cpu", ("--no-cpu_float32",)),
        ("nki_moe_qwen3_30b_a3b", "cpu", ("--report.scale", "")),  # a config of the user's own: no scale
    ],
    ids=["cuda", "neuron", "cpu-smoke", "cpu-bench-for-accelerators", "cpu-opted-out", "cpu-own-config"],
)
def test_the_precision_is_the_configs_own_elsewhere(name, kind, flags):
    config = parsed(name, *flags)
    before = (config.training.mixed_precision_param, list(config.override.imports))
    assert finish.cpu_float32(config, kind) is None
    assert (config.training.mixed_precision_param, config.override.imports) == before


@pytest.mark.parametrize("kind", ["cpu", "cuda", "neuron"])
def test_a_float32_run_off_neuron_computes_its_experts_in_float32(kind):
    """Asked for float32 compute (a parity check, a comparison with transformers' greedy answers), the nki_moe
    reference experts follow it instead of casting to bf16; on Neuron the kernels keep bf16."""
    config = parsed("nki_moe_qwen3_smoke", "--training.mixed_precision_param", "float32")
    assert finish.cpu_float32(config, kind) is None  # nothing a full-scale line should say
    entries = [(entry, {}) if isinstance(entry, str) else entry for entry in config.override.imports]
    dtypes = [kwargs.get("compute_dtype") for target, kwargs in entries if target == finish.NKI_EXPERTS]
    assert dtypes == ([None] if kind == "neuron" else ["float32"])
