"""The streamed export over two FSDP ranks (torchrun, gloo): each rank writes its own rows, one folder, atomic.

Run: .venv/bin/python -m pytest tests/test_export_ranks.py
"""

import json
import os

import pytest

from conftest import run_scenario

pytestmark = pytest.mark.training


def export(tmp_path, mode):
    target = tmp_path / "out"
    result = run_scenario("sharded_export", mode, str(target), nproc=2)
    lines = [line for line in result.stdout.splitlines() if line.startswith(("rank ", "same", "different"))]
    return result, target, lines


def test_each_rank_writes_its_own_rows_once_and_rank_0_publishes_the_folder(tmp_path):
    result, target, lines = export(tmp_path, "ok")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    wrote = {line.split()[1]: int(line.split()[3]) for line in lines if " wrote " in line}
    index = json.loads((target / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 2
    assert sorted(wrote) == ["0", "1"] and min(wrote.values()) > 0  # both wrote
    assert sum(wrote.values()) == index["metadata"]["total_size"]  # every byte once
    assert "same weights" in lines
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_failed_write_on_rank_1_fails_every_rank_and_leaves_no_folder(tmp_path):
    result, target, lines = export(tmp_path, "fail")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert sorted(line.split(" raised ")[0] for line in lines) == ["rank 0", "rank 1"], lines
    assert all(line.endswith("rank 1: OSError: disk full on rank 1") for line in lines), lines
    assert os.listdir(tmp_path) == []  # no folder, no .partial- staging
