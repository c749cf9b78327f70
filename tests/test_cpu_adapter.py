"""Each CPU-adapter patch: the upstream failure it works around, and that the patch removes it.

Every scenario runs twice in fresh interpreters, at once: without the adapter it must fail the way
torchtitan 0.3.0 fails on CPU (if upstream fixes it, the test says the patch can go), and with
the adapter it must work. WholeDraws is checked through the launcher: a 2-rank run's initial weights against a
1-rank init. Run: .venv/bin/python -m pytest tests/test_cpu_adapter.py
"""

import re
import subprocess
import sys

import pytest

from conftest import REPO, meta_model, run_scenarios, worker_env

from entrypoint.variants import VARIANTS


@pytest.mark.training
def test_device_is_cpu_only_with_adapter():
    upstream, patched = run_scenarios("device_selection", "upstream", "patched")
    assert upstream.returncode != 0 and "NVIDIA driver" in upstream.stderr + upstream.stdout
    assert patched.returncode == 0, patched.stderr
    assert "device_type=cpu copied=cpu local_device=cpu:0" in patched.stdout
    peak = float(re.search(r"peak_gib=([\d.]+)", patched.stdout).group(1))
    assert 0.05 < peak < 8, "peak memory should be this process's resident set"


@pytest.mark.training
def test_native_attention_backward_on_cpu():
    upstream, patched = run_scenarios("flex_attention_backward", "upstream", "patched")
    assert upstream.returncode != 0 and "does not support backward on CPU" in upstream.stderr
    assert patched.returncode == 0, patched.stderr
    err = float(re.search(r"max_abs_err=(\S+)", patched.stdout).group(1))
    assert err < 1e-5 and "grad_finite=True" in patched.stdout
    assert "compiled_frames=0" in patched.stdout, "the block mask should be built eagerly, without Inductor"


@pytest.mark.training
def test_transformers_backend_attention_on_cpu():
    upstream, patched = run_scenarios("hf_flex_attention", "upstream", "patched")
    assert upstream.returncode != 0 and "FlexAttention does not support backward on CPU" in upstream.stderr
    assert patched.returncode == 0, patched.stderr
    assert float(re.search(r"max_abs_err=(\S+)", patched.stdout).group(1)) < 1e-5


@pytest.mark.training
def test_fsdp_gradient_reduction_over_gloo():
    upstream, patched = run_scenarios("fsdp_gloo", "upstream", "patched", nproc=2)
    assert upstream.returncode != 0 and "PREMUL_SUM" in upstream.stdout + upstream.stderr
    assert patched.returncode == 0, patched.stderr[-2000:]
    assert "grad ok rank=0" in patched.stdout and "grad ok rank=1" in patched.stdout


def one_rank_init(variant: str) -> dict:
    """{key: tensor} of `variant`'s smoke model as a 1-rank run initialises it (the smoke seed, no FSDP), in
    process."""
    import torch

    from neuron_qwen3 import config_registry
    from neuron_qwen3.quirks import hf_rope_fix

    if variant == "v5":
        hf_rope_fix.apply()  # as the v5 trainer does before it builds the model
    config = getattr(config_registry, f"{variant}_qwen3_smoke")()
    _, model = meta_model(config)
    model.to_empty(device="cpu")
    torch.manual_seed(config.debug.seed)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return model.state_dict()


@pytest.mark.training
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_two_ranks_start_from_the_one_rank_init(variant, tmp_path):
    """A 2-rank run's random init (FSDP shards every matrix by rows) is the 1-rank run's, exactly: without
    WholeDraws each rank filled its shard from its alike-seeded generator, and each matrix was one draw twice. The
    step-1 checkpoint of a run at learning rate 0 holds the initial weights."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    env = worker_env(
        VARIANT=variant,
        SCALE="smoke",
        NPROC="2",
        STEPS="1",
        OUTPUT_DIR=str(tmp_path / "out"),
        CHECKPOINT_DIR=str(tmp_path / "checkpoints"),
        EXTRA_ARGS="--tune.lr 0 --checkpoint.enable_first_step_checkpoint",
    )
    result = subprocess.run([sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    dcp_to_torch_save(tmp_path / "checkpoints" / "step-1", tmp_path / "step-1.pt")
    started = torch.load(tmp_path / "step-1.pt", weights_only=False)
    drawn = one_rank_init(variant)
    random = [key for key, value in drawn.items() if value.dim() >= 2 and value.std() > 0]
    assert len(random) >= 8, sorted(drawn)
    for key in random:
        half = started[key].shape[0] // 2
        assert not torch.equal(started[key][:half], started[key][half:]), f"{key}: the two ranks' rows are one draw"
        torch.testing.assert_close(started[key].to(drawn[key].dtype), drawn[key], rtol=0, atol=0, msg=key)


def test_lse_path_matches_logsumexp():
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    from neuron_qwen3.quirks.cpu_adapter import dense_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    mask = create_block_mask(lambda b, h, qi, ki: ki <= qi, 1, None, 16, 16, device="cpu")
    out, lse = dense_attention(q, k, v, mask, return_lse=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    scores = (q @ k.transpose(-2, -1)) / 8**0.5
    scores = scores.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1))


def test_refuses_other_torchtitan_versions(monkeypatch):
    import torchtitan

    from neuron_qwen3.quirks import cpu_adapter

    monkeypatch.setattr(torchtitan, "__version__", "0.4.0")
    monkeypatch.setattr(cpu_adapter, "_active", False)
    with pytest.raises(RuntimeError, match="found torchtitan 0.4.0"):
        cpu_adapter.activate()


def test_inert_when_an_accelerator_exists(monkeypatch):
    import torch

    from neuron_qwen3.quirks import cpu_adapter

    assert cpu_adapter.needed()  # this host has none
    monkeypatch.setattr(torch._utils, "_get_available_device_type", lambda: "neuron")
    assert not cpu_adapter.needed()
