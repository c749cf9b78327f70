"""INIT_FROM's load (load.py): over three FSDP ranks (torchrun, gloo) against the saved weights and torchtitan's
own load; in process, one unsharded model and the folders it refuses.

Run: .venv/bin/python -m pytest tests/test_hf_load.py
"""

import re

import pytest
import torch

from conftest import run_scenario

VARIANTS = ("native", "nki_moe", "v5")


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    result = run_scenario("hf_load", str(tmp_path_factory.mktemp("hf_load")), nproc=3)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return [line for line in result.stdout.splitlines() if line.startswith("rank ")]


def count(line):
    done, _, total = line.rpartition(" (")[0].split()[-3:]
    return int(done), int(total)


@pytest.mark.training
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rank_loads_every_weight_as_saved_from_a_sharded_folder(lines, variant):
    saved = [line for line in lines if line.startswith("rank ") and f" {variant} saved " in line]
    assert len(saved) == 3, lines
    for line in saved:
        done, total = count(line)
        assert done == total > 10 and "files)" in line and not line.endswith("(1 files)"), line


@pytest.mark.training
@pytest.mark.parametrize("variant", ["native", "v5"])
def test_the_shards_equal_torchtitans_initial_load(lines, variant):
    same = [line.split(" same ")[1].split(" of ") for line in lines if f" {variant} torchtitan same " in line]
    assert len(same) == 3 and all(done == total for done, total in same), lines


@pytest.mark.training
def test_uneven_experts_load_where_torchtitans_adapter_refuses_them(lines):
    """4 experts over 3 ranks: torchtitan 0.3.0's MoE adapter asks for an even split (_caculate_indices_from_
    placements); the rows are loaded here all the same (the test above: as saved)."""
    refused = [line for line in lines if " nki_moe torchtitan: ValueError" in line]
    assert len(refused) == 3 and "cannot be evenly divided" in refused[0], lines


@pytest.mark.training
def test_a_weight_split_by_columns_is_left_to_torchtitan(lines):
    assert sorted(line for line in lines if " columns " in line) == [f"rank {r} columns refused" for r in range(3)]


# ---- in process: one unsharded model ---------------------------------------------------------------------------


def native_smoke():
    from neuron_qwen3 import config_registry

    config = config_registry.native_qwen3_smoke()
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    torch.manual_seed(0)
    model = model_config.build()
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return model, config.model_spec.state_dict_adapter(model_config, None)


def saved(tmp_path, change=lambda tensors: None):
    from safetensors.torch import save_file

    model, adapter = native_smoke()
    tensors = {key: value.detach().clone().contiguous() for key, value in adapter.to_hf(model.state_dict()).items()}
    change(tensors)
    save_file(tensors, tmp_path / "model.safetensors")
    return model, adapter, tensors


def test_an_unsharded_model_loads_every_weight_and_its_fused_qkv_as_torchtitans_merge_lays_it_out(tmp_path):
    from neuron_qwen3.hf import load

    model, adapter, tensors = saved(tmp_path)
    expected = {key: value.clone() for key, value in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    assert load.load([model], adapter, str(tmp_path))
    found = model.state_dict()
    assert any(key.endswith("wq.weight") for key in found)  # the fused QKV, as its state-dict hook splits it
    assert all(torch.equal(found[key], expected[key]) for key in expected)


@pytest.mark.parametrize(
    "change, error",
    [
        (
            lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"),
            "model.layers.1.self_attn.k_proj.weight is not in the folder's safetensors: the model needs it",
        ),
        (
            lambda t: t.update({"model.norm.weight": torch.ones(3)}),
            "model.norm.weight is [3] in the folder, the model's is",
        ),
    ],
)
def test_a_missing_or_misshapen_tensor_is_one_line_naming_it(tmp_path, change, error):
    from neuron_qwen3.hf import load

    model, adapter, _ = saved(tmp_path, change)
    with pytest.raises(load.LoadError, match=re.escape(error)):
        load.load([model], adapter, str(tmp_path))
