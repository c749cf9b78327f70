"""The one FLOPs formula (recipes/neuron_qwen3/report/flops.py) against a hand count, the honest peaks, and the
metrics backends every config turns on."""

import pytest
import torch
from transformers import AutoConfig

from neuron_qwen3 import config_registry, shapes
from neuron_qwen3.report import flops

SEQ = 256


def test_dense_smoke_count_by_hand():
    # The smoke twins' shape: dim 128, 2 layers, 4 heads of 32, 2 kv heads, SwiGLU 384, vocab 2048, tied head.
    shape = shapes.of_model_config(config_registry.native_qwen3_smoke().model_spec.model)
    assert shape == shapes.Shape(
        dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, hidden_dim=384, vocab_size=2048, tied=True
    )
    attention = 128 * 128 + 128 * 64 + 128 * 64 + 128 * 128  # wq, wk, wv, wo = 49,152
    ffn = 3 * 128 * 384  # 147,456
    head = 128 * 2048  # 262,144: the tied head still multiplies
    assert flops.active_matmul_params(shape) == 2 * (attention + ffn) + head == 655_360
    assert flops.per_token(shape, SEQ) == 6 * 655_360 + 12 * 2 * 4 * 32 * SEQ == 4_718_592


def test_moe_smoke_counts_only_the_experts_a_token_uses():
    # The MoE smoke twin: dim 512 (the NKI kernels' smallest H), 2 layers, 4 heads of 32, 2 kv heads, 4 experts of
    # 64, top 2, vocab 2048, untied head.
    shape = shapes.of_model_config(config_registry.nki_moe_qwen3_smoke().model_spec.model)
    assert (shape.dim, shape.num_experts, shape.top_k, shape.hidden_dim, shape.tied) == (512, 4, 2, 64, False)
    attention = 512 * 128 + 512 * 64 + 512 * 64 + 128 * 512  # wq, wk, wv, wo = 196,608
    moe = 512 * 4 + 2 * 3 * 512 * 64  # router + two of the four experts = 198,656
    head = 512 * 2048  # untied here: the head is its own weight, the embedding is a lookup
    assert flops.per_token(shape, SEQ) == 6 * (2 * (attention + moe) + head) + 12 * 2 * 4 * 32 * SEQ == 11_821_056


def test_v5_reads_the_same_shape_from_the_hugging_face_config():
    hf = AutoConfig.from_pretrained(config_registry.HF_MODEL["smoke"])
    native = shapes.of_model_config(config_registry.native_qwen3_smoke().model_spec.model)
    assert shapes.of_model_config(hf) == native  # the smoke twins are one model: one count


def test_agrees_with_torchtitans_native_count_up_to_the_norm_weights():
    model_config = config_registry.native_qwen3_smoke().model_spec.model
    with torch.device("meta"):
        model = model_config.build()
    _, upstream = model_config.get_nparams_and_flops(model, SEQ)
    norms = sum(p.numel() for name, p in model.named_parameters() if "norm" in name)
    assert upstream - 6 * norms == flops.per_token(shapes.of_model_config(model_config), SEQ)


def test_cpu_has_no_peak_and_says_why():
    peak = flops.peak("cpu", "cpu")
    assert peak.flops is None and "CPU" in peak.source


def test_gpu_peaks_come_from_torchtitans_table_and_unknown_gpus_get_none(monkeypatch):
    monkeypatch.setattr("subprocess.run", lambda *a, **k: type("R", (), {"stdout": ""})())  # no lspci lines
    assert flops.peak("cuda", "NVIDIA H200").flops == 989e12
    assert flops.peak("cuda", "NVIDIA A100-SXM4-80GB").flops == 312e12
    unknown = flops.peak("cuda", "NVIDIA GeForce GTX 1080")
    assert unknown.flops is None and "not in torchtitan's peak table" in unknown.source


@pytest.mark.parametrize("lnc, expected", [(2, 158e12), (1, 79e12)])
def test_trainium2_peak_is_per_logical_core_at_the_configured_lnc(monkeypatch, lnc, expected):
    import torchtitan.tools.utils as tt_utils

    chip = type("Properties", (), {"name": "trn2"})()
    monkeypatch.setattr(tt_utils, "device_module", type("M", (), {"get_device_properties": lambda *a: chip}))
    monkeypatch.setattr("subprocess.run", lambda *a, **k: type("R", (), {"stdout": ""})())
    peak = flops.peak("neuron", "neuron", logical_nc_config=lnc)
    assert peak.flops == pytest.approx(expected) and f"LNC={lnc}" in peak.source


def test_tensorboard_always_and_wandb_only_when_the_flag_asks():
    for config in (
        config_registry.native_qwen3_4b(),
        config_registry.v5_qwen3_smoke(),
        config_registry.nki_moe_qwen3_bench(),
    ):
        assert config.metrics.enable_tensorboard and config.metrics.save_tb_folder == "tb"
        assert config.metrics.enable_wandb is False  # the launcher passes --metrics.enable_wandb (tests: plan)
