"""Every run leaves $OUTPUT_DIR/report/ (recipes/neuron_qwen3/report.py), a stopped run says so, and the
comparison lists every variant. One short smoke run per variant through the launcher, shared by the module."""

import io
import json
import os
import signal
import struct
import subprocess
import sys
import time

import pytest

from entrypoint.variants import VARIANTS
from bench import compare
from neuron_qwen3 import config_registry, plots

pytestmark = pytest.mark.training
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 4  # two warm-up steps, two in the steady state
RECORD_KEYS = {"step", "time", "loss", "grad_norm", "lr", "tokens_per_s_per_device", "tokens_per_s", "step_time_s",
               "data_loading_s", "tflops_per_device", "mfu_pct", "memory_gib", "tokens_seen", "steps_total"}


def launcher_env(out, cache, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "WANDB_"))}
    return {**base, "SCALE": "smoke", "NPROC": "1", "OUTPUT_DIR": str(out), "CACHE_DIR": str(cache), **env}


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{variant: (OUTPUT_DIR, launcher stdout)} of one finished smoke run each."""
    base, cache = tmp_path_factory.mktemp("runs"), tmp_path_factory.mktemp("cache")
    done = {}
    for variant in VARIANTS:
        out = base / variant
        result = subprocess.run([sys.executable, "-m", "entrypoint"], cwd=REPO, capture_output=True, text=True,
                                env=launcher_env(out, cache, VARIANT=variant, STEPS=str(STEPS)), timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        done[variant] = out, result.stdout
    return done


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_leaves_a_report_that_parses(runs, variant):
    out, _ = runs[variant]
    records = [json.loads(line) for line in (out / "report" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))  # the smoke configs log every step
    assert all(set(r) == RECORD_KEYS for r in records)
    assert all(r["loss"] > 0 and r["tokens_per_s"] > 0 and r["step_time_s"] > 0 and r["lr"] > 0 for r in records)
    summary = json.loads((out / "report" / "summary.json").read_text())
    assert (summary["variant"], summary["scale"], summary["config"]) == (variant, "smoke",
                                                                         VARIANTS[variant].configs["smoke"])
    assert summary["end"] == "finished" and summary["steps"] == {"done": STEPS, "planned": STEPS}
    assert summary["device"] == {"kind": "cpu", "name": "cpu", "count": 1}
    assert (summary["processes"], summary["nodes"]) == (1, 1)
    assert summary["steady_state"]["steps"] == [3, 4] and summary["warmup"]["steps"] == [1, 2]
    training = getattr(config_registry, VARIANTS[variant].configs["smoke"])().training
    assert summary["tokens_seen"] == STEPS * training.local_batch_size * training.seq_len  # one rank
    assert (summary["first_loss"], summary["last_loss"]) == (records[0]["loss"], records[-1]["loss"])
    assert 0 < summary["launch_to_first_step_s"] < summary["wall_s"]
    assert summary["versions"]["torchtitan"] == "0.3.0" and summary["versions"]["torch-neuronx"] is None
    assert list((out / "tb").rglob("events.out.tfevents.*")), "no TensorBoard events under $OUTPUT_DIR/tb"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cpu_runs_have_no_mfu_and_say_why(runs, variant):
    out, _ = runs[variant]
    summary = json.loads((out / "report" / "summary.json").read_text())
    assert summary["mfu"]["pct"] is None and summary["mfu"]["peak_flops"] is None
    assert "CPU" in summary["mfu"]["peak_source"]
    assert all(json.loads(line)["mfu_pct"] is None for line in (out / "report" / "metrics.jsonl").open())
    assert summary["flops"]["per_token"] > 0 and summary["flops"]["tflops_per_device"] > 0


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_plots_are_pngs_of_the_expected_size(runs, variant):
    out, _ = runs[variant]
    expected = tuple(round(inches * plots.PLOT_DPI) for inches in plots.PLOT_SIZE)
    for name in ("loss.png", "throughput.png"):
        assert png_size(out / "report" / name) == expected


def test_rank_0_logs_a_progress_line(runs):
    _, stdout = runs["native"]
    assert f"progress: step 1/{STEPS}  " in stdout  # the first logged step, at once; then once a minute


def test_the_comparison_lists_every_variant(runs, tmp_path):
    text = io.StringIO()
    compared = compare.compare([runs[v][0] for v in VARIANTS], plot=tmp_path / "loss.png", stream=text)
    assert list(compared) == list(VARIANTS)
    rows = [line for line in text.getvalue().splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [row.split(" | ")[0].strip("| ") for row in rows] == list(VARIANTS)
    assert png_size(tmp_path / "loss.png") == tuple(round(i * plots.PLOT_DPI) for i in plots.PLOT_SIZE)


def test_a_stopped_run_says_stopped(tmp_path):
    """SIGTERM to the launcher mid-run: every process stops, and the summary says `stopped`, not `failed`."""
    out = tmp_path / "out"
    env = launcher_env(out, tmp_path / "cache", VARIANT="native", STEPS="1000", STOP_GRACE="60")
    with open(tmp_path / "log", "w") as log:
        launcher = subprocess.Popen([sys.executable, "-m", "entrypoint"], cwd=REPO, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        metrics = out / "report" / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
            assert launcher.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()[-3000:]
            time.sleep(0.1)
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=120)
    summary = json.loads((out / "report" / "summary.json").read_text())
    assert summary["end"] == "stopped", summary["end_detail"]
    assert 2 <= summary["steps"]["done"] < 1000 and summary["steps"]["planned"] == 1000
    assert (out / "report" / "loss.png").exists()
