"""The progress line rank 0 logs with the run report (recipes/neuron_qwen3/report/run_report.py), on a fake clock."""

import json
import logging

from neuron_qwen3.report import run_report


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


METRICS = {
    "loss_metrics/global_avg_loss": 2.5,
    "grad_norm": 1.0,
    "lr/0": 1e-4,
    "throughput(tps)": 1234.5,
    "time_metrics/end_to_end(s)": 3.0,
    "time_metrics/data_loading(s)": 0.1,
    "tflops": 1.0,
    "memory/max_reserved(GiB)": 1.0,
}


def test_the_first_step_at_once_then_at_most_one_line_per_interval(tmp_path, caplog):
    clock = Clock()
    backend = run_report.ReportLogger(tmp_path, world_size=1, log_freq=1, steps=100, progress_every=60, clock=clock)
    with caplog.at_level(logging.INFO):
        for step in range(1, 50):  # a step every second for 49 s
            clock.now = step
            backend.log(METRICS, step)
        clock.now = 70
        backend.log(METRICS, 50)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress:")]
    assert lines == [
        "progress: step 1/100  1,234 tokens/s  loss 2.5000  ETA 4m57s",
        "progress: step 50/100  1,234 tokens/s  loss 2.5000  ETA 2m30s",
    ]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 50  # every step is recorded


def test_validation_records_are_not_training_steps(tmp_path):
    backend = run_report.ReportLogger(tmp_path, world_size=1, log_freq=1, steps=10)
    backend.log({"validation_metrics/loss": 3.0}, 5)
    [line] = [json.loads(text) for text in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert backend.records == [] and (line["step"], line["validation_loss"]) == (5, 3.0)


def test_duration():
    assert [run_report.duration(s) for s in (5, 125, 3725)] == ["0m05s", "2m05s", "1h02m"]
