"""Full-scale model assets: fetched through huggingface_hub in a child process, skipped when present, never
when offline, and the token never printed. No test reaches the network: a stand-in `huggingface_hub` package
(first on PYTHONPATH) plays the Hub, the way the real snapshot_download is called.

Run: .venv/bin/python -m pytest tests/test_entrypoint_assets.py -q
"""

import subprocess
import sys

import pytest

import fake_hub
from fake_hub import TOKEN, asked, full_scale, run_launcher

from entrypoint import cli, launch, preflight
from neuron_qwen3.hf import fetch as assets


@pytest.fixture
def hub(tmp_path):
    """PYTHONPATH and environment that make `import huggingface_hub` load the stand-in (tests/fake_hub.py)."""
    return fake_hub.env(tmp_path)


def fetch(hub, dest, *flags, **env):
    return subprocess.run(
        [sys.executable, "-m", "neuron_qwen3.hf.fetch", "Qwen/Qwen3-4B", str(dest), *flags],
        env={**hub, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_missing_lists_the_required_files(tmp_path):
    assert assets.missing(tmp_path / "none") == list(assets.ASSETS)
    (tmp_path / "config.json").write_text("{}")
    assert assets.missing(tmp_path) == ["tokenizer.json", "tokenizer_config.json"]


def test_fetch_downloads_the_tokenizer_and_config_and_never_prints_the_token(hub, tmp_path):
    result = fetch(hub, tmp_path / "Qwen3-4B")
    assert result.returncode == 0, result.stderr
    assert assets.missing(tmp_path / "Qwen3-4B") == []
    assert TOKEN not in result.stdout + result.stderr
    assert "with token ***" in result.stderr and "100%" in result.stderr  # the progress bar passes through
    [(repo, dest, patterns)] = asked(tmp_path)
    assert (repo, dest) == ("Qwen/Qwen3-4B", str(tmp_path / "Qwen3-4B"))
    assert set(assets.ASSETS) <= set(patterns) and not [p for p in patterns if "safetensors" in p]


def test_a_failed_fetch_is_one_redacted_line_and_status_1(hub, tmp_path):
    result = fetch(hub, tmp_path / "Qwen3-4B", FAKE_HUB_FAIL="1")
    assert result.returncode == 1 and TOKEN not in result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("assets: could not")]
    assert errors == [
        "assets: could not fetch Qwen/Qwen3-4B into "
        f"{tmp_path}/Qwen3-4B: OSError: 401 Client Error for url https://huggingface.co/Qwen/Qwen3-4B "
        "(Authorization: Bearer ***); to go on, fill it where the Hub is reachable (`hf download "
        "Qwen/Qwen3-4B --include 'config.json' 'tokenizer.json' 'tokenizer_config.json' 'generation_config.json' "
        "'vocab.json' 'merges.txt' --local-dir "
        f"{tmp_path}/Qwen3-4B`) or mount a folder that has them at ASSETS_DIR"
    ]


def test_offline_or_checked_it_fetches_nothing_and_says_what_is_missing(hub, tmp_path):
    offline = fetch(hub, tmp_path / "Qwen3-4B", "--offline")
    assert (offline.returncode, offline.stdout, offline.stderr.count("\n")) == (2, "", 1), offline.stderr
    assert offline.stderr.startswith(
        f"assets: {tmp_path}/Qwen3-4B has no config.json, tokenizer.json, "
        "tokenizer_config.json and HF_HUB_OFFLINE=1 forbids downloading them"
    )
    assert "`hf download Qwen/Qwen3-4B --local-dir" in offline.stderr
    checked = fetch(hub, tmp_path / "Qwen3-4B", "--check")
    assert checked.returncode == 3 and "the launch fetches Qwen/Qwen3-4B" in checked.stdout, checked.stderr
    assert asked(tmp_path) == [] and not (tmp_path / "Qwen3-4B").exists()  # nothing fetched, nothing made
    assert fetch(hub, tmp_path / "Qwen3-4B").returncode == 0
    for flags in (("--offline",), ("--check",)):
        assert fetch(hub, tmp_path / "Qwen3-4B", *flags).returncode == 0  # present: nothing to do


def test_an_assets_folder_that_cannot_be_written_stops_before_the_download(hub, tmp_path):
    (tmp_path / "a-file").write_text("")
    for flags in ((), ("--check",)):
        result = fetch(hub, tmp_path / "a-file" / "Qwen3-4B", *flags)
        assert result.returncode == 2 and asked(tmp_path) == [], result.stderr
        assert f"{tmp_path}/a-file/Qwen3-4B (ASSETS_DIR) is not writable" in result.stderr
        assert "mount a writable volume at ASSETS_DIR" in result.stderr


def test_a_fetch_that_leaves_a_file_out_stops_the_launch(hub, tmp_path, monkeypatch, capfd):
    code, out, err, launched = run_launcher(
        monkeypatch, capfd, full_scale(hub, tmp_path, FAKE_HUB_SKIP="tokenizer.json")
    )
    assert code == 1 and launched == [] and "but has no tokenizer.json" in err, err


def test_launcher_fetches_missing_assets_then_launches(hub, tmp_path, monkeypatch, capfd):
    code, out, err, launched = run_launcher(monkeypatch, capfd, full_scale(hub, tmp_path))
    assert code == 0, err
    assert assets.missing(tmp_path / "assets" / "Qwen3-4B") == [] and len(launched) == 1
    assert TOKEN not in out + err
    assert f"--hf_assets_path={tmp_path / 'assets' / 'Qwen3-4B'}" in launched[0]


def test_launcher_skips_the_fetch_when_assets_are_present(hub, tmp_path, monkeypatch, capfd):
    dest = tmp_path / "assets" / "Qwen3-4B-Instruct-2507"
    dest.mkdir(parents=True)
    for name in assets.ASSETS:
        (dest / name).write_text("{}")
    code, out, err, launched = run_launcher(monkeypatch, capfd, full_scale(hub, tmp_path, VARIANT="v5"))
    assert code == 0 and len(launched) == 1, err
    assert asked(tmp_path) == []  # the Hub was never asked
    assert f"assets: {dest} has config.json, tokenizer.json, tokenizer_config.json: not fetching" in out
    assert f"--hf_model={dest}" in launched[0]  # v5 reads config.json from there too


def test_launcher_stops_when_the_fetch_fails(hub, tmp_path, monkeypatch, capfd):
    code, out, err, launched = run_launcher(monkeypatch, capfd, full_scale(hub, tmp_path, FAKE_HUB_FAIL="1"))
    assert code == 1 and launched == [] and TOKEN not in out + err


def test_offline_never_fetches(hub, tmp_path, monkeypatch, capfd):
    code, out, err, launched = run_launcher(monkeypatch, capfd, full_scale(hub, tmp_path, HF_HUB_OFFLINE="1"))
    assert code == 2 and launched == [] and asked(tmp_path) == []
    assert err.count("\n") == 1 and "HF_HUB_OFFLINE=1 forbids downloading" in err


def test_the_launchers_check_asks_the_child_and_fetches_nothing(hub, tmp_path, monkeypatch, capfd):
    passes = []
    monkeypatch.setattr(preflight, "recipes_pass", lambda plan, environ, **asked: passes.append(asked) or ([], {}))
    monkeypatch.setattr(launch, "watch", lambda: None)  # leave pytest's own signal handlers alone
    env = full_scale(hub, tmp_path, MODEL="Qwen/Qwen3-0.6B", INIT_FROM="hub")
    assert cli.main(["--check"], env) == 0
    out, err = capfd.readouterr()
    assert "the launch fetches Qwen/Qwen3-0.6B" in out and "check: the launch would start" in out, out + err
    assert asked(tmp_path) == [] and not (tmp_path / "assets").exists()
    assert passes == [{"check_files": False}]  # the weights come at launch: the pass has nothing to read yet
    assert cli.main(["--check"], {**env, "HF_HUB_OFFLINE": "1"}) == 2
    out, err = capfd.readouterr()
    assert "HF_HUB_OFFLINE=1 forbids downloading" in err and "check: the launch would stop" in out
