"""MODEL: every listed Qwen3 has the shape torchtitan builds, a config that builds, and a plan that says how it fits.

Run: .venv/bin/python -m pytest tests/test_entrypoint_models.py -q
"""

import pytest
import torch
from torchtitan.models.qwen3 import model_registry

from entrypoint import contract, models, plan
from entrypoint.discovery import Devices
from entrypoint.variants import VARIANTS
from neuron_qwen3 import config_registry

TRN2 = Devices("neuron", 64, tuple(f"neuron{i}" for i in range(16)), 2)


def build(environ, devices=TRN2, cli_args=()):
    return plan.build(contract.parse(environ), devices, environ, cli_args)


@pytest.mark.parametrize("flavor", models.SHAPES)
def test_parameter_count_is_torchtitans(flavor):
    """The stdlib shape table against the model torchtitan builds (meta device: no memory, no weights)."""
    with torch.device("meta"):
        model = model_registry(flavor).model.build()
    assert models.SHAPES[flavor].parameters() == sum(p.numel() for p in model.parameters())


def test_active_parameters_of_the_moe_models():
    """Qwen's model cards: 30B-A3B activates 3.3 B, 235B-A22B 22 B (both rounded down)."""
    assert 3.3e9 <= models.SHAPES["30B-A3B"].parameters(active=True) < 3.4e9
    assert 22e9 <= models.SHAPES["235B-A22B"].parameters(active=True) < 23e9


@pytest.mark.parametrize("model", models.MODELS)
def test_every_listed_model_builds_its_config_for_its_variants(model, monkeypatch):
    monkeypatch.setenv("MODEL", model)
    shape = models.MODELS[model]
    for variant in VARIANTS.values():
        if variant.family != shape.family:
            with pytest.raises(contract.UsageError, match=f"is a {shape.family} Qwen3 and VARIANT={variant.name}"):
                build({"VARIANT": variant.name, "MODEL": model})
            continue
        p = build({"VARIANT": variant.name, "MODEL": model, "ASSETS_DIR": "/a"})
        assert p.model == model and p.env["MODEL"] == model
        assert p.config == (variant.configs["full"] if model == variant.hf_repo else variant.any_model_config)
        assert p.assets == f"/a/{models.repo_name(model)}"
        config = getattr(config_registry, p.config)()
        if variant.name == "v5":
            assert config.hf_model == model
        else:
            assert config.model_spec.flavor == shape.flavor
        assert config.hf_assets_path.endswith(f"/{models.repo_name(model)}")


def test_model_at_smoke_scale_and_with_config_are_refused():
    with pytest.raises(contract.UsageError, match="MODEL='Qwen/Qwen3-8B' is for SCALE=full"):
        build({"MODEL": "Qwen/Qwen3-8B", "SCALE": "smoke"})
    with pytest.raises(contract.UsageError, match="exclude each other"):
        build({"MODEL": "Qwen/Qwen3-8B", "CONFIG": "native_qwen3_smoke"})


def test_config_and_module_replace_the_variants_choice():
    p = build({"CONFIG": "my_run", "MODULE": "my_recipes"})
    assert p.argv[p.argv.index("--module") + 1:][:3] == ("my_recipes", "--config", "my_run")
    assert (p.model, p.assets) == (None, None)
    with pytest.raises(contract.UsageError, match="MODULE='my-recipes' is not a Python module name"):
        contract.parse({"MODULE": "my-recipes"})


def test_how_it_fits_is_said_and_judged():
    fits = build({"MODEL": "Qwen/Qwen3-32B"}).parallelism
    assert fits["fits"] and fits["why"].startswith("FSDP over 64 ranks: 7.6 GiB of weights, gradients and Adam state")
    big = build({"VARIANT": "nki_moe", "MODEL": "Qwen/Qwen3-235B-A22B"}).parallelism
    assert not big["fits"] and "it needs at least 244 ranks (add nodes: NNODES)" in big["why"]
    four_nodes = build({"VARIANT": "nki_moe", "MODEL": "Qwen/Qwen3-235B-A22B", "NNODES": "4", "NODE_RANK": "0",
                        "MASTER_ADDR": "10.0.0.1"}).parallelism
    assert four_nodes["fits"] and "FSDP over 256 ranks" in four_nodes["why"]
    lnc1 = build({"MODEL": "Qwen/Qwen3-32B", "NEURON_LOGICAL_NC_CONFIG": "1"},
                 Devices("neuron", 128, TRN2.nodes, 1)).parallelism
    assert lnc1["fits"] and "of 12 GiB" in lnc1["why"]
