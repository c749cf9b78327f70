"""The streamed Hugging Face export (neuron_qwen3.hf.weights.export, shards.py) on one process, against transformers.

Smoke-size models with `--export.max_shard_mb 1`, so every export is several files (the layout's own tests use
a limit of 300 KB). The two-rank export is in test_export_ranks.py (torchrun).
Run: .venv/bin/python -m pytest tests/test_export.py
"""

import json
import os
import types

import pytest
import torch

from conftest import folder_tensors

from neuron_qwen3 import config_registry, shapes
from neuron_qwen3.hf import shards, weights, write

SHARD = 300_000  # bytes, for the layout's tests


def trainer(name, target="", dtype="bfloat16"):
    """What export reads of a Trainer, for a random model of the config `name`, exporting to `target` in files of
    at most 1 MB (HF weights out: no routing bias)."""
    config = getattr(config_registry, name)()
    config.export.dir, config.export.dtype, config.export.max_shard_mb = str(target), dtype, 1
    config.checkpoint.initial_load_in_hf = True
    weights.hf_compatible(config)
    config.model_spec.model.update_from_config(config=config)  # as the trainer does (v5: its HF config)
    with torch.device("meta"):
        model = config.model_spec.model.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return types.SimpleNamespace(config=config, model_parts=[model], model_config=config.model_spec.model)


def layout(run, dtype=torch.bfloat16, shard=SHARD):
    return shards.plan(weights._adapter(run), run.model_parts[0].state_dict(), dtype, shard)


def expected(run, dtype):
    """The Hugging Face tensors of the model, converted whole by the adapter (the old export's way)."""
    states = {k: v.detach().to(dtype) for k, v in run.model_parts[0].state_dict().items()}
    return weights._adapter(run).to_hf(states)


@pytest.mark.parametrize("name", ["native_qwen3_smoke", "nki_moe_qwen3_smoke", "v5_qwen3_smoke"])
def test_shards_are_what_transformers_reads_and_writes(tmp_path, name):
    import transformers

    out = tmp_path / "out"
    run = trainer(name, out)
    assert weights.export(run) == str(out)
    files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    assert files == sorted(layout(run, shard=10**6).files) and len(files) > 1
    written, want = folder_tensors(out), expected(run, torch.bfloat16)
    assert sorted(written) == sorted(want)  # every expert of every layer, no tied lm_head
    assert all(torch.equal(written[k], want[k]) for k in want)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == files

    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    model.save_pretrained(tmp_path / "theirs", max_shard_size="1MB")
    theirs = json.loads((tmp_path / "theirs" / "model.safetensors.index.json").read_text())
    assert index["metadata"] == theirs["metadata"]  # total_parameters and total_size, as transformers counts
    assert (out / "model.safetensors.index.json").read_text().endswith("}\n")
    assert sorted(index["weight_map"]) == sorted(theirs["weight_map"])


@pytest.mark.parametrize("name", ["native_qwen3_smoke", "nki_moe_qwen3_smoke", "v5_qwen3_smoke"])
def test_the_pieces_are_the_checkpointers_state_dict(name):
    """Layer by layer (the fused-QKV hook gathers one layer's q/k/v at a time), the same keys, order and values."""
    from torchtitan.components.checkpoint import ModelWrapper

    run = trainer(name)
    pieces = [piece() for piece in shards.state_dict_pieces(run.model_parts)]
    joined = {key: value for piece in pieces for key, value in piece.items()}
    whole = ModelWrapper(run.model_parts).state_dict()
    assert list(joined) == list(whole) and all(torch.equal(joined[k], whole[k]) for k in whole)
    layers = len(run.model_config.layers) if hasattr(run.model_config, "layers") else 0
    assert len(pieces) == (layers + 3 if layers else 1)  # v5: the transformers model is one piece


def test_pieces_keep_only_the_keys_asked_for():
    run = trainer("native_qwen3_smoke")
    norms = [piece() for piece in shards.state_dict_pieces(run.model_parts, keep=lambda key: "norm" in key)]
    keys = [key for piece in norms for key in piece]
    assert keys and all("norm" in key for key in keys)
    assert keys == [key for key in run.model_parts[0].state_dict() if "norm" in key]


def test_a_small_model_is_one_file_without_an_index_and_its_config_names_the_dtype(tmp_path):
    run = trainer("native_qwen3_smoke", tmp_path / "out", dtype="float32")
    run.config.export.max_shard_mb = 5000
    weights.export(run)
    assert sorted(f for f in os.listdir(tmp_path / "out") if "safetensors" in f) == ["model.safetensors"]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["torch_dtype"] == config["dtype"] == "float32"  # no source: both names
    assert all(t.dtype == torch.float32 for t in folder_tensors(tmp_path / "out").values())


@pytest.mark.parametrize("name", ["native_qwen3_smoke", "nki_moe_qwen3_smoke"])
def test_gathered_units_give_the_same_files(tmp_path, monkeypatch, name):
    """The path for tensors that are not whole rows per rank (TP, EP, more than one host): gather, convert,
    write; every unit of these models is written in place otherwise."""
    run = trainer(name, tmp_path / "in-place")
    assert all(unit.slices for unit in layout(run).units)
    weights.export(run)
    monkeypatch.setattr(shards, "in_place", lambda value: False)
    run.config.export.dir = str(tmp_path / "gathered")
    weights.export(run)
    for name in os.listdir(tmp_path / "in-place"):
        assert (tmp_path / "in-place" / name).read_bytes() == (tmp_path / "gathered" / name).read_bytes(), name


def test_the_plan_keeps_files_under_the_limit():
    plan = layout(trainer("nki_moe_qwen3_smoke"))
    files = [[u for u in plan.units if u.file == i] for i in range(len(plan.files))]
    assert len(files) > 4 and all(sum(u.nbytes for u in units) <= SHARD or len(units) == 1 for units in files)
    experts = [u for u in plan.units if u.key.endswith("inner_experts.w1_EFD")]
    assert experts and all(len(u.entries) == shapes.SMOKE_MOE.num_experts for u in experts)


def test_the_header_is_the_one_safetensors_writes():
    """Byte for byte, padding included, for tensors in safetensors' own order (widest dtype first; ours is the
    state dict's, which its readers accept: the offsets say where each tensor is)."""
    from safetensors.torch import save

    values = {"b": torch.ones(7, dtype=torch.float32), "a": torch.zeros(3, 5, dtype=torch.bfloat16)}
    entries = [shards.Entry(name, tuple(v.shape), v.dtype) for name, v in values.items()]
    ours = shards.header(entries)
    assert save(values, metadata={"format": "pt"}).startswith(ours)


def test_a_failed_write_leaves_no_folder_and_keeps_the_earlier_export(tmp_path, monkeypatch):
    target = tmp_path / "out"
    run = trainer("native_qwen3_smoke", target)
    weights.export(run)
    before = {f: (target / f).read_bytes() for f in os.listdir(target)}
    real, calls = write.pwrite_all, []

    def fail_the_fifth(fd, tensor, offset):
        calls.append(offset)
        if len(calls) == 5:
            raise OSError(28, "No space left on device")
        real(fd, tensor, offset)

    monkeypatch.setattr(write, "pwrite_all", fail_the_fifth)
    with torch.no_grad():
        run.model_parts[0].norm.weight.fill_(2.0)  # a changed model: a half-done export would show it
    with pytest.raises(
        weights.ExportError,
        match=rf"^the export to {target} failed, nothing was written there: "
        r"rank 0: OSError: \[Errno 28\] No space left on device$",
    ):
        weights.export(run)
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no .partial- or .old- folder
    assert {f: (target / f).read_bytes() for f in os.listdir(target)} == before


def test_a_failure_after_the_weights_keeps_the_earlier_export_too(tmp_path, monkeypatch):
    """The staged folder is all or nothing: a companion that cannot be copied fails the export."""
    target = tmp_path / "out"
    run = trainer("native_qwen3_smoke", target)
    weights.export(run)
    before = sorted(os.listdir(target))
    monkeypatch.setattr(weights, "companions", lambda source, assets: [str(tmp_path / "no-such-tokenizer.json")])
    with pytest.raises(weights.ExportError, match=r"rank 0: FileNotFoundError: .*no-such-tokenizer.json"):
        weights.export(run)
    assert sorted(os.listdir(tmp_path)) == ["out"] and sorted(os.listdir(target)) == before


def test_the_export_names_experts_and_dtype_as_the_source_does(tmp_path):
    """transformers 5 writes `num_local_experts` and `dtype`; an export of such a model keeps those names."""
    run = trainer("nki_moe_qwen3_smoke")
    (tmp_path / "config.json").write_text(json.dumps({"num_local_experts": 4, "dtype": "float32"}))
    config = weights.model_config_json(run, str(tmp_path), torch.bfloat16)
    assert config["num_local_experts"] == 4 and config["dtype"] == "bfloat16"
    assert "num_experts" not in config and "torch_dtype" not in config
    without_source = weights.model_config_json(run, None, torch.bfloat16)
    assert without_source["num_experts"] == 4 and without_source["torch_dtype"] == without_source["dtype"]
