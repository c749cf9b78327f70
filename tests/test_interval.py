"""IntervalSums, the one accumulator of every watcher: sums and maxima by name over an interval, each kind of
reduction one all-reduce over real gloo ranks; and the layering it serves: no module of rl/, generate/ or data/
imports report/ (the report reads what they produce, never the other way).
Run: .venv/bin/python -m pytest tests/test_interval.py -q
"""

import ast
import json

import pytest
import torch

from conftest import RECIPES, run_scenario
from neuron_qwen3.interval import IntervalSums


def test_sums_and_maxima_over_an_interval_then_a_fresh_one():
    sums = IntervalSums()
    assert not sums
    for step in range(3):
        sums.add(tokens=torch.tensor(2.0, dtype=torch.float32), counts=torch.tensor([step, 1.0]))
        sums.add(across="max", seconds=0.5 * step)
        sums.most(longest=[4, 9, 1][step])
    found = sums.reduced()
    assert found["tokens"] == 6.0 and isinstance(found["tokens"], float)
    assert found["counts"].tolist() == [3.0, 3.0] and found["counts"].dtype == torch.float64
    assert found["seconds"] == 1.5  # summed over the interval; "max" is across the ranks
    assert found["longest"] == 9 and isinstance(found["longest"], int)  # a count stays an int (int64)
    assert not sums and sums.reduced() == {}


def test_a_figure_added_two_ways_is_refused():
    sums = IntervalSums()
    sums.add(seconds=1.0)
    with pytest.raises(AssertionError, match="seconds: added as sum, now as max"):
        sums.add(across="max", seconds=1.0)
    with pytest.raises(AssertionError, match="across 'min' is not one of sum, max, kept"):
        sums.add(across="min", x=1.0)


def test_two_gloo_ranks_one_all_reduce_per_kind():
    done = run_scenario("interval_ranks", nproc=2, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tokens"] == 2 * 1.0 + 2 * 2.0  # each rank's interval sum, summed over the ranks
    assert result["load"] == [2.0, 20.0]  # [rank, 10 * step]: rank 1 twice; 0 then 10 on each rank
    assert result["seconds"] == 4.0  # rank 1's interval sum, the larger
    assert result["rows"] == 14.0  # kept: the interval's sum, not multiplied by the ranks
    assert result["widest"] == 4.0
    assert sorted(result["calls"]) == [2, 3]  # sums (tokens, load[2]) and maxima (seconds, widest): once each


def imported_modules(path) -> set:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def test_no_run_side_module_imports_the_report():
    package = RECIPES / "neuron_qwen3"
    reaching = sorted(
        str(path.relative_to(package))
        for folder in ("rl", "generate", "data")
        for path in (package / folder).rglob("*.py")
        if any(name.startswith("neuron_qwen3.report") for name in imported_modules(path))
    )
    assert not reaching, f"{', '.join(reaching)} import neuron_qwen3.report: hand what they produce to the trainer"
