"""Integration: every variant's smoke config trains through the launcher, on 1 and 2 processes.

These are real torchrun runs on CPU (gloo), a few tens of seconds each. Run:
    .venv/bin/python -m pytest tests/test_training.py
"""

import functools
import math
import os
import re
import subprocess
import sys

import pytest

from conftest import ANSI, REPO, STEP_LOSS, worker_env

from entrypoint.variants import VARIANTS

pytestmark = pytest.mark.training

SMOKE_MOE_LAYERS = 2  # shapes.SMOKE_MOE.n_layers; every layer of the smoke MoE is an MoE layer


def parse_losses(output: str) -> dict[int, float]:
    return {int(step): float(loss) for step, loss in STEP_LOSS.findall(ANSI.sub("", output))}


@functools.cache
def launch(variant: str, nproc: int, tmp: str) -> subprocess.CompletedProcess:
    env = worker_env(VARIANT=variant, SCALE="smoke", NPROC=str(nproc), OUTPUT_DIR=f"{tmp}/{variant}-{nproc}",
                     CACHE_DIR=f"{tmp}/cache")
    return subprocess.run([sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("training"))


@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_smoke_trains_with_falling_loss(variant, nproc, tmp):
    result = launch(variant, nproc, tmp)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = parse_losses(result.stdout + result.stderr)
    assert sorted(losses) == list(range(1, 11)), f"expected steps 1..10 in the log, got {sorted(losses)}"
    assert all(math.isfinite(x) for x in losses.values()), losses
    assert losses[10] < losses[1] - 0.3, losses
    assert f"--nproc_per_node={nproc}" in result.stdout + result.stderr  # the launch line


def test_nki_moe_replaces_every_moe_layer(tmp):
    result = launch("nki_moe", 1, tmp)
    log = ANSI.sub("", result.stdout + result.stderr)
    replaced = re.findall(r"\[Override\] neuron_qwen3\.moe\.experts\.nki_grouped_experts: (\S+)", log)
    assert replaced == [f"model_spec.model.layers.{i}.moe.routed_experts.inner_experts"
                        for i in range(SMOKE_MOE_LAYERS)], replaced
    assert f"Applied {SMOKE_MOE_LAYERS} override(s)" in log
    assert "nki_moe kernel path: reference" in log


def test_nki_moe_matches_native_moe_step_by_step(tmp):
    """Same seed, same data, same weights: the expert override must not change the maths."""
    nki = launch("nki_moe", 1, tmp)
    native = subprocess.run(  # the article's hand-typed command: stock torchtitan.train
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "--rdzv_backend", "c10d",
         "--rdzv_endpoint", "127.0.0.1:0", "--local-addr", "127.0.0.1", "-m", "torchtitan.train",
         "--module", "neuron_qwen3", "--config", "native_moe_qwen3_smoke", "--dump_folder", f"{tmp}/native-moe"],
        env=worker_env(), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert native.returncode == 0, native.stderr[-3000:]
    nki_losses, native_losses = parse_losses(nki.stdout + nki.stderr), parse_losses(native.stdout + native.stderr)
    assert sorted(native_losses) == sorted(nki_losses) == list(range(1, 11))
    # Both compute the experts in bf16, in different groupings (torchtitan per expert, the reference in padded
    # 256-row blocks), so even step 1 agrees to bf16 roundings only, and later steps drift further as the input
    # gradient differs by one rounding too (tests/test_nki_experts.py). Measured on this 2-core host on the packed
    # smoke data (issue 19): step 1 5.4e-5 relative, at most 4.4e-4 over the ten steps (step 10).
    assert nki_losses[1] == pytest.approx(native_losses[1], rel=1e-4), (nki_losses[1], native_losses[1])
    for step in native_losses:
        assert nki_losses[step] == pytest.approx(native_losses[step], rel=1e-3), (step, nki_losses, native_losses)
