"""The one record of Qwen3's shapes (recipes/neuron_qwen3/shapes.py): torchtitan builds what it says, every MODEL
finds its config function, the bundled config.json files derive from it, and the memory estimate says how it fits.

Run: .venv/bin/python -m pytest tests/test_shapes.py -q
"""

import importlib.util
import json

import pytest
import torch
from torchtitan.models.qwen3 import model_registry

from entrypoint import contract, plan
from entrypoint.discovery import Devices
from entrypoint.variants import VARIANTS
from neuron_qwen3 import config_registry, shapes
from neuron_qwen3.prelaunch import preflight

TRN2 = Devices("neuron", 64, tuple(f"neuron{i}" for i in range(16)), 2)


def build(environ):
    return plan.build(contract.parse(environ), TRN2, environ)


@pytest.mark.parametrize("flavor", shapes.FLAVORS)
def test_parameter_count_is_torchtitans(flavor):
    """The shape record against the model torchtitan builds (meta device: no memory, no weights)."""
    with torch.device("meta"):
        model = model_registry(flavor).model.build()
    assert shapes.FLAVORS[flavor].parameters() == sum(p.numel() for p in model.parameters())
    assert shapes.of_model_config(model_registry(flavor).model) == shapes.FLAVORS[flavor]


def test_active_parameters_of_the_moe_models():
    """Qwen's model cards: 30B-A3B activates 3.3 B, 235B-A22B 22 B (both rounded down)."""
    assert 3.3e9 <= shapes.FLAVORS["30B-A3B"].parameters(active=True) < 3.4e9
    assert 22e9 <= shapes.FLAVORS["235B-A22B"].parameters(active=True) < 23e9


@pytest.mark.parametrize("model", shapes.MODELS)
def test_every_listed_model_runs_its_flavors_config_function(model):
    flavor = shapes.MODELS[model]
    for variant in VARIANTS.values():
        p = build({"VARIANT": variant.name, "MODEL": model, "ASSETS_DIR": "/a"})
        assert p.model == model and p.assets == f"/a/{shapes.repo_name(model)}"
        assert variant.config_for(model) == f"{variant.name}_qwen3_{shapes.flavor_name(flavor)}"
        built = getattr(config_registry, p.config, None)
        family = "moe" if variant.name == "nki_moe" else "dense"
        if shapes.FLAVORS[flavor].family != family:  # the pre-launch pass names the family in one line
            assert built is None
            line = preflight.missing_config(
                f"Config function '{p.config}' not found", {"model": model, "variant": variant.name}
            )
            assert line.startswith(
                f"MODEL='{model}' is a {shapes.FLAVORS[flavor].family} Qwen3 and "
                f"VARIANT={variant.name} trains the other family (allowed: "
            )
            continue
        config = built()
        assert (config.report.variant, config.report.scale, config.report.config) == (variant.name, "full", p.config)
        if variant.name == "v5":
            assert config.hf_model.startswith("Qwen/Qwen3-" + flavor)
        else:
            assert config.model_spec.flavor == flavor


def test_a_qwen3_that_was_never_released_is_named():
    line = preflight.missing_config(
        "Config function 'native_qwen3_9b' not found", {"model": "Qwen/Qwen3-9B", "variant": "native"}
    )
    assert line.startswith("MODEL='Qwen/Qwen3-9B' is not a released Qwen3 (allowed: Qwen/Qwen3-0.6B, ")


def test_model_at_smoke_scale_and_with_config_are_refused():
    with pytest.raises(contract.UsageError, match="MODEL='Qwen/Qwen3-8B' is for SCALE=full"):
        build({"MODEL": "Qwen/Qwen3-8B", "SCALE": "smoke"})
    with pytest.raises(contract.UsageError, match="exclude each other"):
        build({"MODEL": "Qwen/Qwen3-8B", "CONFIG": "native_qwen3_smoke"})


def test_config_and_module_replace_the_variants_choice():
    p = build({"CONFIG": "my_run", "MODULE": "my_recipes"})
    assert p.argv[p.argv.index("--module") + 1 :][:3] == ("my_recipes", "--config", "my_run")
    assert (p.model, p.assets) == (None, None)
    with pytest.raises(contract.UsageError, match="MODULE='my-recipes' is not a Python module name"):
        contract.parse({"MODULE": "my-recipes"})


def test_the_bundled_model_configs_are_the_records(tmp_path):
    """assets/make_assets.py writes them from shapes.py: regenerated here, they equal the committed files."""
    spec = importlib.util.spec_from_file_location("make_assets", config_registry.ASSETS / "make_assets.py")
    make_assets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_assets)
    committed = {
        name: json.loads((config_registry.ASSETS / name / "config.json").read_text()) for name in make_assets.HF_CONFIGS
    }
    make_assets.write_hf_configs(committed["hf_qwen3_tiny"]["eos_token_id"], tmp_path)
    assert {name: json.loads((tmp_path / name / "config.json").read_text()) for name in committed} == committed
    assert {str(path) for path in config_registry.HF_MODEL.values()} == {
        str(config_registry.ASSETS / name) for name in make_assets.HF_CONFIGS
    }


def test_how_it_fits_is_said_and_judged():
    fits, why = shapes.fit(shapes.FLAVORS["32B"].parameters(), 64, 24)
    assert fits and why.startswith("FSDP over 64 ranks: 7.6 GiB of weights, gradients and Adam state")
    fits, why = shapes.fit(shapes.FLAVORS["235B-A22B"].parameters(), 64, 24)
    assert not fits and "it needs at least 244 ranks (add nodes: NNODES)" in why
    assert shapes.fit(shapes.FLAVORS["235B-A22B"].parameters(), 256, 24)[0]
    fits, why = shapes.fit(shapes.FLAVORS["32B"].parameters(), 128, 12)
    assert fits and "of 12 GiB" in why
