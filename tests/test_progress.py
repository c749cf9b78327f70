"""The launcher's progress line (entrypoint/progress.py), driven by a hand-written metrics.jsonl and a fake clock."""

import io
import json

from entrypoint import contract, plan, progress
from entrypoint.discovery import Devices


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def write(path, *records):
    with open(path, "a") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def record(step, time=100.0, **extra):
    return {"step": step, "time": time, "steps_total": 100, "tokens_per_s": 1234.5, "loss": 2.5,
            "step_time_s": 3.0, **extra}


def test_prints_step_of_total_tokens_per_second_and_eta(tmp_path):
    out, clock = io.StringIO(), Clock()
    watch = progress.Progress(str(tmp_path / "metrics.jsonl"), interval=60, stream=out, clock=clock, since=0)
    watch.poll()  # no file yet: nothing
    write(tmp_path / "metrics.jsonl", record(40))
    watch.poll()
    assert out.getvalue() == "entrypoint: step 40/100  1,234 tokens/s  loss 2.5000  ETA 3m00s\n"


def test_at_most_one_line_per_interval_and_none_without_a_new_step(tmp_path):
    out, clock = io.StringIO(), Clock()
    path = tmp_path / "metrics.jsonl"
    watch = progress.Progress(str(path), interval=60, stream=out, clock=clock, since=0)
    for step in range(1, 50):  # a step every second for 49 s
        write(path, record(step))
        clock.now = step
        watch.poll()
    assert len(out.getvalue().splitlines()) == 1  # step 1 only
    clock.now = 70
    watch.poll()
    assert out.getvalue().splitlines()[-1].startswith("entrypoint: step 49/100")
    clock.now = 200
    watch.poll()  # no step since
    assert len(out.getvalue().splitlines()) == 2


def test_skips_an_earlier_runs_records_and_half_written_lines(tmp_path):
    out, clock = io.StringIO(), Clock()
    path = tmp_path / "metrics.jsonl"
    write(path, record(7, time=10.0))  # left by a previous run in the same OUTPUT_DIR
    watch = progress.Progress(str(path), interval=0, stream=out, clock=clock, since=50.0)
    watch.poll()
    assert out.getvalue() == ""
    with open(path, "a") as f:
        f.write(json.dumps(record(1))[:20])  # the worker is mid-write
    watch.poll()
    assert out.getvalue() == ""


def test_only_training_commands_get_a_progress_line_and_a_log_is_not_flooded(tmp_path):
    assert progress.Progress.for_command(["python", "-m", "entrypoint.fetch_assets", "repo", "dest"]) is None
    watch = progress.Progress.for_command(["torchrun", "--dump_folder", str(tmp_path)], stream=io.StringIO())
    assert watch.path == str(tmp_path / "report" / "metrics.jsonl")
    assert watch.interval == progress.LOG_INTERVAL  # not a terminal


def test_the_plans_own_command_is_watched_where_it_writes(tmp_path):
    """The plan passes `--dump_folder=/abs` (a path may start with `-`); the last one wins, as in torchtitan."""
    settings = contract.parse({"SCALE": "smoke", "OUTPUT_DIR": str(tmp_path / "out")})
    argv = plan.build(settings, Devices("cpu", 2), {"SCALE": "smoke"}).argv
    watch = progress.Progress.for_command([*argv, "--dump_folder=/elsewhere"], stream=io.StringIO())
    assert watch.path == "/elsewhere/report/metrics.jsonl"
    assert progress.Progress.for_command(argv, stream=io.StringIO()).path == str(tmp_path / "out" / "report" /
                                                                                 "metrics.jsonl")


def test_duration():
    assert [progress.duration(s) for s in (5, 125, 3725)] == ["0m05s", "2m05s", "1h02m"]
