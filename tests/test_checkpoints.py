"""Which checkpoint a restart resumes from: real DCP checkpoints (written by torch), then damaged on purpose.

The pre-launch pass reads them with torch's own DCP reader (recipes/neuron_qwen3/prelaunch/checkpoints.py); the fixture
writes them with torch, as torchtitan does.
Run: .venv/bin/python -m pytest tests/test_checkpoints.py -q
"""

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_qwen3.prelaunch import checkpoints

REPO = Path(__file__).resolve().parent.parent
WRITE = """
import sys, torch, torch.distributed.checkpoint as dcp
for step in sys.argv[2:]:
    state = {"model.w": torch.arange(4096.0) * int(step), "model.b": torch.ones(64), "train_state": {"step": int(step)}}
    dcp.save(state, checkpoint_id=f"{sys.argv[1]}/step-{step}")
"""


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A checkpoint folder with real DCP saves at steps 10 and 20 (one torch start for the module)."""
    folder = tmp_path_factory.mktemp("pristine")
    subprocess.run([sys.executable, "-W", "ignore", "-c", WRITE, str(folder), "10", "20"], check=True, timeout=300)
    return folder


@pytest.fixture
def folder(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path / "ckpt")
    return tmp_path / "ckpt"


def data_file(step_folder):
    return next(p for p in step_folder.iterdir() if p.suffix == ".distcp")


def test_complete_checkpoints_are_found_and_the_newest_wins(folder):
    assert checkpoints.problem(folder / "step-10") is None and checkpoints.problem(folder / "step-20") is None
    assert checkpoints.scan(folder) == checkpoints.Scan(str(folder), 20, ())
    assert checkpoints.prepare(str(folder), node_rank=0) == (20, [])
    assert checkpoints.scan(folder.parent / "absent") == checkpoints.Scan(str(folder.parent / "absent"), None, ())


def test_metadata_ranges_are_really_read(folder):
    needed = checkpoints._storage_ranges(folder / "step-20")
    assert needed == {data_file(folder / "step-20").name: data_file(folder / "step-20").stat().st_size}


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda step: os.truncate(data_file(step), data_file(step).stat().st_size - 1), "bytes, .metadata needs"),
        (lambda step: data_file(step).unlink(), "is missing"),
        (lambda step: os.truncate(step / ".metadata", 100), "unreadable .metadata"),
        (lambda step: (step / ".metadata").write_bytes(b"not a pickle"), "unreadable .metadata"),
    ],
)
def test_a_damaged_latest_checkpoint_is_skipped_and_moved_aside(folder, damage, why):
    damage(folder / "step-20")
    found = checkpoints.scan(folder)
    assert found.latest == 10
    assert [(name, step) for name, step, _ in found.broken] == [("step-20", 20)]
    assert why in found.broken[0][2]
    latest, lines = checkpoints.prepare(str(folder), node_rank=0)
    assert latest == 10 and len(lines) == 1 and "step-20" in lines[0] and why in lines[0] and "\n" not in lines[0]
    assert sorted(p.name for p in folder.iterdir()) == ["incomplete", "step-10"]  # torchtitan now sees only step-10
    assert [p.name.split(".")[0] for p in (folder / "incomplete").iterdir()] == ["step-20"]
    assert checkpoints.STEP.search("incomplete") is None  # torchtitan's pattern never matches the aside folder


def test_only_node_zero_moves_anything(folder):
    os.truncate(data_file(folder / "step-20"), 10)
    latest, lines = checkpoints.prepare(str(folder), node_rank=1)
    assert latest == 10 and "skipped" in lines[0]
    assert (folder / "step-20").is_dir()


def test_everything_broken_means_a_fresh_start(folder):
    for step in ("step-10", "step-20"):
        os.truncate(data_file(folder / step), 10)
    assert checkpoints.prepare(str(folder), node_rank=0)[0] is None
    assert not [p for p in folder.iterdir() if checkpoints.STEP.search(p.name)]


def test_entries_torchtitan_ignores_are_ignored(folder):
    (folder / "step-30").write_text("a file, not a folder")
    (folder / "notes").mkdir()
    assert checkpoints.scan(folder) == checkpoints.Scan(str(folder), 20, ())


def test_hf_format_last_checkpoint(tmp_path):
    step = tmp_path / "step-5"
    step.mkdir()
    (step / "model.safetensors.index.json").write_text('{"weight_map": {"a": "model-1.safetensors"}}')
    assert checkpoints.problem(step) == "model-1.safetensors is missing"
    (step / "model-1.safetensors").write_bytes(b"x")
    assert checkpoints.problem(step) is None


def test_a_save_still_being_written_is_left_in_place(folder):
    """A folder without .metadata may be another process's save in flight (DCP writes .metadata last)."""
    writing = folder / "step-30"
    writing.mkdir()
    shard = writing / "__0_0.distcp"
    shard.write_bytes(b"half a shard")
    latest, lines = checkpoints.prepare(str(folder), node_rank=0)
    assert latest == 20 and shard.read_bytes() == b"half a shard"  # not moved: the writer's rename still works
    assert len(lines) == 1 and "step-30" in lines[0] and "left in place" in lines[0]
    assert not (folder / "incomplete").exists()


@pytest.mark.parametrize("code", [errno.EACCES, errno.EIO, errno.ESTALE])
def test_a_read_error_stops_the_launch_and_moves_nothing(folder, monkeypatch, code):
    real_open = open

    def failing_open(path, *args, **kwargs):
        if str(path).endswith("step-20/.metadata"):
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(checkpoints, "open", failing_open, raising=False)
    with pytest.raises(OSError) as raised:
        checkpoints.prepare(str(folder), node_rank=0)
    line = str(raised.value)
    assert "step-20/.metadata" in line and errno.errorcode[code] in line and "nothing was moved" in line
    assert "\n" not in line
    assert sorted(p.name for p in folder.iterdir()) == ["step-10", "step-20"]


def test_a_data_file_read_error_is_not_corruption(folder, monkeypatch):
    real_getsize = os.path.getsize

    def failing_getsize(path):
        if str(path).endswith(".distcp"):
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))
        return real_getsize(path)

    monkeypatch.setattr(os.path, "getsize", failing_getsize)
    with pytest.raises(OSError, match="EIO"):
        checkpoints.prepare(str(folder), node_rank=0)
    assert sorted(p.name for p in folder.iterdir()) == ["step-10", "step-20"]


def test_incomplete_keeps_only_what_the_latest_launch_moved(folder):
    earlier = folder / "incomplete" / "step-5.20250101T000000.1"
    earlier.mkdir(parents=True)
    (earlier / "__0_0.distcp").write_bytes(b"x" * 1000)
    os.truncate(data_file(folder / "step-20"), 10)
    _, lines = checkpoints.prepare(str(folder), node_rank=0)
    assert [p.name.split(".")[0] for p in (folder / "incomplete").iterdir()] == ["step-20"]
    assert f"deleted {earlier}: set aside by an earlier launch" in lines


def test_nothing_broken_leaves_incomplete_alone(folder):
    earlier = folder / "incomplete" / "step-5.20250101T000000.1"
    earlier.mkdir(parents=True)
    checkpoints.prepare(str(folder), node_rank=0)
    assert earlier.is_dir()


def test_check_moves_nothing(folder):
    """--check (move=False) reports a broken checkpoint and leaves it where it is."""
    os.truncate(data_file(folder / "step-20"), 10)
    latest, lines = checkpoints.prepare(str(folder), node_rank=0, move=False)
    assert latest == 10 and "skipped" in lines[0] and (folder / "step-20").is_dir()


def test_the_launch_resumes_from_load_step_when_it_is_given_and_complete(folder, tmp_path):
    """`--checkpoint.load_step` makes torchtitan load that step instead of the newest: the launcher's line and its
    checks are about that step too, and a step that is not a complete checkpoint stops the launch."""

    def check(step):
        env = dict(os.environ, SCALE="smoke", CHECKPOINT_DIR=str(folder), EXTRA_ARGS=f"--checkpoint.load_step={step}")
        command = [sys.executable, "-m", "entrypoint", "--check"]
        return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

    assert f"entrypoint: checkpoints: resuming from step 10 in {folder}\n" in check(10).stdout
    os.remove(folder / "step-10" / ".metadata")
    for step, why in [(10, "no .metadata: the save did not finish"), (15, "no such folder")]:
        refused = check(step)
        assert refused.returncode == 2
        assert f"--checkpoint.load_step={step}: {folder}/step-{step}: {why}" in refused.stderr, refused.stderr
