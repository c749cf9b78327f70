"""The experts' load in a MoE run's report (recipes/neuron_qwen3/report/run_report.py): metrics.jsonl's `moe` and
`loss_ce`, summary.json's `moe`, experts.png, and TensorBoard's `moe/` scalars; a dense run has none of them.

Unit tests on a fabricated load (moe/routing.py's RouterWatch.interval), then two real launcher runs at once:
nki_moe at smoke scale on 2 ranks (2 steps; the load is summed over the ranks) and native for 1 step.
Run: .venv/bin/python -m pytest tests/test_report_experts.py -q
"""

import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, rank_logs, side_by_side_env
from test_report_progress import METRICS

from neuron_qwen3 import config_registry, shapes
from neuron_qwen3.report import plots, run_report

LOAD = {
    "layers": [
        {"tokens": [10, 30, 20, 4], "max_mean": 30 / 16, "entropy": 1.2},
        {"tokens": [16, 16, 16, 16], "max_mean": 1.0, "entropy": 1.38},
    ],
    "aux": 2.1,
    "z": 3.5,
    "padding": 0.25,
}
AUX, Z = 0.001, 0.01  # the coefficients of the real run (MOE_AUX_LOSS, MOE_Z_LOSS), and the fake watch's
NPROC, STEPS = 2, 2


def watch(load=LOAD):
    return SimpleNamespace(last=load, aux_coef=AUX, z_coef=Z)


def records_of(tmp_path, steps, log_freq=1, router=None):
    backend = run_report.ReportLogger(tmp_path, world_size=1, log_freq=log_freq, steps=10, router=router)
    for step in steps:
        backend.log(METRICS, step)
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def png_size(path):
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_a_moe_record_holds_the_load_and_the_cross_entropy_apart(tmp_path):
    [record] = records_of(tmp_path, [1], router=watch())
    assert record["moe"] == {"aux_loss": 2.1, "z_loss": 3.5, "block_padding": 0.25, "layers": LOAD["layers"]}
    assert record["loss_ce"] == pytest.approx(2.5 - AUX * 2.1 - Z * 3.5, abs=1e-12)


def test_no_cross_entropy_when_the_interval_spans_steps(tmp_path):
    """The load's losses are then the interval's means, the logged loss its last step's: no exact difference."""
    records = records_of(tmp_path, [1, 5, 6], log_freq=5, router=watch())
    assert [("loss_ce" in r, "moe" in r) for r in records] == [(True, True), (False, True), (True, True)]


def test_a_layer_that_routed_nothing_and_torchtitans_own_experts_are_nulls(tmp_path):
    """Strict JSON: no NaN. Without the NKI experts (native_moe) there are no blocks to pad."""
    empty = {**LOAD, "layers": [{"tokens": [0, 0, 0, 0], "max_mean": math.nan, "entropy": math.nan}], "padding": None}
    [record] = records_of(tmp_path, [1], router=watch(empty))
    assert "NaN" not in (tmp_path / "metrics.jsonl").read_text()
    assert record["moe"]["layers"] == [{"tokens": [0, 0, 0, 0], "max_mean": None, "entropy": None}]
    assert record["moe"]["block_padding"] is None


def test_a_dense_run_or_an_interval_without_routing_has_no_moe(tmp_path):
    assert not any({"moe", "loss_ce"} & set(r) for r in records_of(tmp_path, [1, 2]))
    assert not any({"moe", "loss_ce"} & set(r) for r in records_of(tmp_path / "none", [1], router=watch(None)))
    assert run_report.moe_summary([{"step": 1}]) is None


def test_the_summary_names_the_last_intervals_worst_layer():
    worse = {**LOAD, "layers": LOAD["layers"][::-1], "aux": 2.4}
    records = [
        {"step": 1, "moe": run_report.moe_record(LOAD)},
        {"step": 2, "moe": run_report.moe_record(worse)},
        {"step": 3},
    ]
    assert run_report.moe_summary(records) == {
        "step": 2,
        "worst_layer": 1,
        "max_mean": 30 / 16,
        "entropy": 1.2,
        "block_padding": 0.25,
        "aux_loss": 2.4,
        "z_loss": 3.5,
    }


def test_the_experts_heatmap_is_a_png_of_the_reports_size(tmp_path):
    plots.plot_experts([layer["tokens"] for layer in LOAD["layers"]], 3, tmp_path / "experts.png")
    assert png_size(tmp_path / "experts.png") == tuple(inch * plots.PLOT_DPI for inch in plots.PLOT_SIZE)


# ---- real runs ---------------------------------------------------------------------------------------------


def launch(out, **env):
    env = side_by_side_env(SCALE="smoke", OUTPUT_DIR=str(out), CACHE_DIR=f"{out.parent}/cache", **env)
    result = subprocess.run(
        [sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + rank_logs(out)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(MoE OUTPUT_DIR, dense OUTPUT_DIR), launched at once: their imports share the cores."""
    tmp = tmp_path_factory.mktemp("experts")
    moe = dict(VARIANT="nki_moe", NPROC=str(NPROC), STEPS=str(STEPS), MOE_AUX_LOSS=str(AUX), MOE_Z_LOSS=str(Z))
    dense = dict(VARIANT="native", STEPS="1")
    with ThreadPoolExecutor(2) as pool:
        done = [pool.submit(launch, tmp / "moe", **moe), pool.submit(launch, tmp / "dense", **dense)]
        return tuple(future.result() for future in done)


def report(out):
    folder = out / "report"
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return records, json.loads((folder / "summary.json").read_text())


def tb_scalars(out) -> dict:
    """TensorBoard's scalars under $OUTPUT_DIR/tb: tag -> {step: value}."""
    from tensorboard.backend.event_processing import event_accumulator  # locked: a missing one fails, not skips

    [folder] = (out / "tb").iterdir()
    events = event_accumulator.EventAccumulator(str(folder))
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


@pytest.mark.training
def test_every_step_of_a_moe_run_records_every_layers_load(runs):
    records, _ = report(runs[0])
    training, shape = config_registry.nki_moe_qwen3_smoke().training, shapes.SMOKE_MOE
    routed = NPROC * training.local_batch_size * training.seq_len * shape.top_k  # every window of the corpus is full
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:
        moe = record["moe"]
        assert len(moe["layers"]) == shape.n_layers
        for layer in moe["layers"]:
            tokens = layer["tokens"]
            assert len(tokens) == shape.num_experts and sum(tokens) == routed, tokens  # all ranks' tokens
            assert layer["max_mean"] == pytest.approx(max(tokens) / (sum(tokens) / len(tokens)))
            assert 1 <= layer["max_mean"] <= shape.num_experts / shape.top_k  # an expert gets a token once
            assert 0 < layer["entropy"] <= math.log(shape.num_experts)
        assert 0 <= moe["block_padding"] < 1
        # a random router routes near uniformly: aux ~ top_k (transformers' scale), where one rank's share is half
        assert 0.75 * shape.top_k < moe["aux_loss"] < 1.5 * shape.top_k, moe["aux_loss"]
        assert moe["z_loss"] > 0
        assert record["loss"] - record["loss_ce"] == pytest.approx(AUX * moe["aux_loss"] + Z * moe["z_loss"])


@pytest.mark.training
def test_a_moe_runs_summary_plot_and_tensorboard_have_the_load(runs):
    records, summary = report(runs[0])
    last = records[-1]["moe"]
    worst = max(range(len(last["layers"])), key=lambda i: last["layers"][i]["max_mean"])
    layer = last["layers"][worst]
    assert summary["moe"] == {
        "step": STEPS,
        "worst_layer": worst,
        "max_mean": layer["max_mean"],
        "entropy": layer["entropy"],
        "block_padding": last["block_padding"],
        "aux_loss": last["aux_loss"],
        "z_loss": last["z_loss"],
    }
    assert png_size(runs[0] / "report" / "experts.png") == (800, 450)
    scalars = tb_scalars(runs[0])
    for record in records:
        moe, step = record["moe"], record["step"]
        expected = {
            "moe/aux_loss": moe["aux_loss"],
            "moe/z_loss": moe["z_loss"],
            "moe/block_padding": moe["block_padding"],
        }
        for i, layer in enumerate(moe["layers"]):
            expected |= {f"moe/layer{i}/max_mean": layer["max_mean"], f"moe/layer{i}/entropy": layer["entropy"]}
        assert {tag: scalars[tag][step] for tag in expected} == pytest.approx(expected, rel=1e-6)  # float32 there


@pytest.mark.training
def test_a_dense_run_has_no_experts_load(runs):
    records, summary = report(runs[1])
    assert records and not any({"moe", "loss_ce"} & set(r) for r in records)
    assert "moe" not in summary and not (runs[1] / "report" / "experts.png").exists()
    assert not any(tag.startswith("moe/") for tag in tb_scalars(runs[1]))
