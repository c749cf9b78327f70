"""The comparison table and plots (bench/compare.py, recipes/neuron_qwen3/report/plots.py) on hand-written run
folders."""

import io
import json

from bench import compare
from neuron_qwen3.report import plots


def run_folder(path, variant, tokens_per_s, compiled=False, mfu=None):
    report = path / "report"
    report.mkdir(parents=True)
    summary = {
        "variant": variant,
        "compile": compiled,
        "end": "finished",
        "steps": {"done": 4, "planned": 4},
        "tokens_per_s": tokens_per_s,
        "step_time_s": 512 / tokens_per_s,
        "peak_memory_gib": 1.5,
        "first_loss": 7.5,
        "last_loss": 6.25,
        "mfu": {"pct": mfu, "peak_source": "CPU: no agreed peak" if mfu is None else "table"},
    }
    (report / "summary.json").write_text(json.dumps(summary))
    (report / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 8 - s}) + "\n" for s in (1, 2, 3)))
    return path


def test_table_rows_ratios_and_why_mfu_is_missing(tmp_path):
    eager = run_folder(tmp_path / "eager", "native", 100.0)
    compiled = run_folder(tmp_path / "compiled", "native", 170.0, compiled=True)
    out = io.StringIO()
    runs = compare.compare([eager, compiled], stream=out)
    assert list(runs) == ["native", "native+compile"]
    lines = out.getvalue().splitlines()
    assert lines[2] == "| native | finished | 4/4 | 100.0 | 1.00 | 5.120 | n/a | 1.50 | 7.5000 | 6.2500 |"
    assert lines[3].startswith("| native+compile | finished | 4/4 | 170.0 | 1.70 | 3.012 | n/a |")
    assert "MFU n/a: CPU: no agreed peak" in lines[4]
    assert (tmp_path / "loss.png").exists()  # the runs' common folder


def test_two_runs_of_one_variant_are_told_apart_by_folder(tmp_path):
    a = run_folder(tmp_path / "a", "v5", 10.0)
    b = run_folder(tmp_path / "b", "v5", 20.0, mfu=12.5)
    runs = compare.compare([a, b / "report"], plot=tmp_path / "p.png", stream=io.StringIO())
    assert list(runs) == ["v5", "v5 (b)"]  # a report/ folder is named after its run


def test_smoothing_starts_at_the_first_value_and_follows_a_constant():
    assert plots.smoothed([4.0, 4.0, 4.0]) == [4.0, 4.0, 4.0]
    assert plots.smoothed([10.0, 0.0])[0] == 10.0 and 0 < plots.smoothed([10.0, 0.0])[1] < 10.0


def test_gpu_script_tabulates_ratios_and_failures():
    from bench import gpu_compare

    def result(variant, compiled, how, tps, code=0):
        summary = {"end": "finished", "tokens_per_s": tps, "mfu": {"pct": 40.0}} if tps else {}
        return {"variant": variant, "compiled": compiled, "how": how, "exit": code, "summary": summary}

    table = gpu_compare.report(
        [
            result("native", False, "launcher", 1000.0),
            result("native", False, "by-hand", 1000.0),
            result("native", True, "launcher", 1500.0),
            result("native", True, "by-hand", 1600.0),
            result("v5", False, "launcher", None, code=1),
        ]
    ).splitlines()
    assert table[2] == "| native | eager | 0 | finished | 1,000.0 | 1,000.0 | 1.000 | 40.00 | - |"
    assert table[3] == "| native | compile | 0 | finished | 1,500.0 | 1,600.0 | 0.938 | 40.00 | 1.50 |"
    assert table[4].startswith("| v5 | eager | 1 | - | - |")
