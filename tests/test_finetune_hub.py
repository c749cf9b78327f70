"""INIT_FROM=hub: the launcher fetches the plan's MODEL with its weights into $ASSETS_DIR/<repo name>, through
huggingface_hub in a child process, the token never printed, and points torchtitan's initial load at that folder.

No test reaches the network: the stand-in `huggingface_hub` of tests/fake_hub.py plays the Hub and writes a
sharded model (index + two safetensors) when the weights are asked for. Resuming a broken download is
huggingface_hub's own (`snapshot_download(local_dir=...)`), not proven here.
"""

import json
import shutil
import subprocess
import sys

import pytest

import fake_hub
from fake_hub import TOKEN, asked, full_scale, run_launcher

from neuron_qwen3.hf import fetch as assets

MODEL = "Qwen/Qwen3-0.6B"  # any dense MODEL but native's default, so the plan's model is the one fetched


@pytest.fixture
def hub(tmp_path):
    return fake_hub.env(tmp_path)


def test_missing_weights_count_only_when_asked(tmp_path):
    for name in assets.ASSETS:
        (tmp_path / name).write_text("{}")
    assert assets.missing(tmp_path) == []
    assert assets.missing(tmp_path, weights=True) == ["*.safetensors"]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-1.safetensors"}}))
    assert assets.missing(tmp_path, weights=True) == ["*.safetensors"]  # a shard the index names is absent
    (tmp_path / "model-1.safetensors").write_text("")
    assert assets.missing(tmp_path, weights=True) == []


def test_fetch_with_weights_gets_every_shard_and_never_prints_the_token(hub, tmp_path):
    dest = tmp_path / "Qwen3-0.6B"
    result = subprocess.run(
        [sys.executable, "-m", "neuron_qwen3.hf.fetch", MODEL, str(dest), "--weights"],
        env=hub,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert TOKEN not in result.stdout + result.stderr and "100%" in result.stderr  # progress passes through
    assert assets.missing(dest, weights=True) == []
    [(repo, local_dir, patterns)] = asked(tmp_path)
    assert (repo, local_dir) == (MODEL, str(dest)) and set(assets.WEIGHTS) <= set(patterns)


def test_a_fetch_that_misses_a_shard_stops_the_launch(hub, tmp_path, monkeypatch, capfd):
    env = full_scale(hub, tmp_path, MODEL=MODEL, INIT_FROM="hub", FAKE_HUB_SKIP="model-00002")
    code, out, err, launched = run_launcher(monkeypatch, capfd, env)
    assert code == 1 and launched == [] and err.strip().endswith("but has no *.safetensors"), err


def test_launcher_fetches_the_plans_model_and_loads_it(hub, tmp_path, monkeypatch, capfd):
    env = full_scale(hub, tmp_path, MODEL=MODEL, INIT_FROM="hub")
    code, out, err, launched = run_launcher(monkeypatch, capfd, env)
    assert code == 0, err
    dest = str(tmp_path / "assets" / "Qwen3-0.6B")
    assert [call[:2] for call in asked(tmp_path)] == [[MODEL, dest]]
    assert TOKEN not in out + err and len(launched) == 1
    argv = launched[0]
    assert f"--checkpoint.initial_load_path={dest}" in argv and "--checkpoint.initial_load_in_hf" in argv
    # a second launch finds everything in place and asks the Hub nothing
    code, out, err, launched = run_launcher(monkeypatch, capfd, env)
    assert code == 0 and len(launched) == 1 and len(asked(tmp_path)) == 1, err


def test_assets_without_weights_are_fetched_again_for_init_from_hub(hub, tmp_path, monkeypatch, capfd):
    dest = tmp_path / "assets" / "Qwen3-0.6B"
    dest.mkdir(parents=True)
    for name in assets.ASSETS:
        (dest / name).write_text("{}")
    code, out, err, launched = run_launcher(monkeypatch, capfd, full_scale(hub, tmp_path, MODEL=MODEL, INIT_FROM="hub"))
    assert code == 0 and len(launched) == 1, err
    [(repo, _, patterns)] = asked(tmp_path)
    assert repo == MODEL and "*.safetensors" in patterns


def test_offline_without_weights_is_one_line_naming_the_model(hub, tmp_path, monkeypatch, capfd):
    env = full_scale(hub, tmp_path, MODEL=MODEL, INIT_FROM="hub", HF_HUB_OFFLINE="1")
    code, out, err, launched = run_launcher(monkeypatch, capfd, env)
    assert code == 2 and launched == [] and asked(tmp_path) == []
    assert err.count("\n") == 1 and "*.safetensors" in err and f"hf download {MODEL} " in err, err


def test_too_little_disk_for_the_weights_stops_before_the_download(hub, tmp_path):
    dest = tmp_path / "Qwen3-0.6B"
    shard = int(shutil.disk_usage(tmp_path).free * 0.6)  # two shards do not fit, one does

    def fetch():
        return subprocess.run(
            [sys.executable, "-m", "neuron_qwen3.hf.fetch", MODEL, str(dest), "--weights"],
            env={**hub, "FAKE_HUB_SHARD_BYTES": str(shard)},
            capture_output=True,
            text=True,
            timeout=60,
        )

    result = fetch()
    assert result.returncode == 2 and asked(tmp_path) == []
    [line] = [line for line in result.stderr.splitlines() if line.startswith("assets: ")]
    assert line.startswith(f"assets: {MODEL}'s files need ") and "GiB free" in line and TOKEN not in line
    dest.mkdir()
    (dest / "model-00001-of-00002.safetensors").write_text("")  # a resumed download needs only the other shard
    assert fetch().returncode == 0 and len(asked(tmp_path)) == 1
