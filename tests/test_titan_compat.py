"""The seams for a torchtitan other than 0.3.0: the compat import and the image build's config check.

Run: .venv/bin/python -m pytest tests/test_titan_compat.py -q
"""

import importlib
import importlib.util
import sys
import types

from conftest import REPO

from entrypoint.variants import VARIANTS

from neuron_qwen3.quirks import titan_compat


def load_config_check():
    spec = importlib.util.spec_from_file_location("config_check", REPO / "ci" / "image" / "config-check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lr_schedulers_from_the_old_home_on_an_older_torchtitan(monkeypatch):
    old = types.ModuleType("torchtitan.components.lr_scheduler")
    old.LRSchedulersContainer = sentinel = type("LRSchedulersContainer", (), {})
    monkeypatch.setitem(sys.modules, "torchtitan.components.optimizer", types.ModuleType("optimizer"))  # moved away
    monkeypatch.setitem(sys.modules, "torchtitan.components.lr_scheduler", old)
    try:
        assert importlib.reload(titan_compat).LRSchedulersContainer is sentinel
    finally:
        monkeypatch.undo()
        importlib.reload(titan_compat)
    from torchtitan.components.optimizer import LRSchedulersContainer

    assert titan_compat.LRSchedulersContainer is LRSchedulersContainer


def test_the_image_config_check_builds_every_config_here(capsys):
    assert load_config_check().main() == 0
    configs = {name for variant in VARIANTS.values() for name in variant.configs.values()}
    assert capsys.readouterr().out.startswith(
        f"config-check: {len(configs)} config functions build on torchtitan 0.3.0"
    )


def test_the_image_config_check_fails_on_a_config_that_does_not_build(monkeypatch, capsys):
    from neuron_qwen3 import config_registry

    def broken():
        raise AttributeError("'JobConfig' object has no attribute 'override'")

    monkeypatch.setattr(config_registry, "nki_moe_qwen3_smoke", broken)
    assert load_config_check().main() == 1
    err = capsys.readouterr().err
    assert "nki_moe smoke (nki_moe_qwen3_smoke): AttributeError" in err and err.startswith("config-check: FAILED")
