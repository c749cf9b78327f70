"""A torchtitan user's habits: arguments passed through, misspelt variables, whose logs show, which device, --check.

Run: .venv/bin/python -m pytest tests/test_entrypoint_usage.py -q
"""

import os
import re
import subprocess

import pytest

from entrypoint import contract, hygiene, plan
from entrypoint.discovery import Devices

from conftest import REPO, launcher_at

CPU = Devices("cpu", 2)


def build(environ, cli_args=(), devices=CPU):
    return plan.build(contract.parse(environ), devices, environ, cli_args)


def entrypoint(*args, cwd=REPO, root="/", **env):
    return subprocess.run(
        launcher_at(root, *args),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ["PATH"], **env},
    )


def test_other_arguments_go_to_torchtitan_after_extra_args():
    p = build({"SCALE": "smoke", "EXTRA_ARGS": "--training.steps 3"}, ["--training.steps", "5", "--x.y=z"])
    assert p.argv[-5:] == ("--training.steps", "3", "--training.steps", "5", "--x.y=z")  # the last one wins
    result = entrypoint("--dry-run", "--training.steps", "5", SCALE="smoke")
    assert result.returncode == 0 and '"--training.steps",\n    "5"' in result.stdout, result.stderr
    assert '"steps": 5' in result.stdout  # and the config that will run says so


@pytest.mark.parametrize(
    "words, variable",
    [
        (["--checkpoint.folder", "/x"], "CHECKPOINT_DIR"),
        (["--checkpoint.folder=/x"], "CHECKPOINT_DIR"),
        (["--dump_folder", "/o"], "OUTPUT_DIR"),
        (["--dump-folder", "/o"], "OUTPUT_DIR"),
        (["--checkpoint.keep_latest_k", "1"], "CHECKPOINT_KEEP"),
        (["--config", "x"], "CONFIG"),
        (["--module=x"], "MODULE"),
    ],
)
def test_flags_the_launcher_owns_are_refused_from_either_source(words, variable):
    flag = words[0].split("=")[0].lstrip("-").replace("-", "_")
    with pytest.raises(
        contract.UsageError, match=f"the command line sets --{flag}, which the launcher owns: use {variable}"
    ):
        build({"SCALE": "smoke"}, words)
    with pytest.raises(contract.UsageError, match=f"EXTRA_ARGS sets --{flag}, which the launcher owns: use {variable}"):
        build({"SCALE": "smoke", "EXTRA_ARGS": " ".join(words)})


def test_a_near_miss_or_another_launchers_variable_is_one_warning_each():
    result = entrypoint("--dry-run", SCALE="smoke", VARAINT="nki_moe", NGPU="8")
    assert result.returncode == 0
    assert result.stderr.splitlines() == [
        "entrypoint: warning: NGPU is not read by this launcher: use NPROC (processes per node; default: every core or "
        "GPU found)",
        "entrypoint: warning: VARAINT is not read by this launcher: did you mean VARIANT?",
    ]
    assert (
        hygiene.stray_names(
            {
                "SLURM_JOBID": "1",
                "NVIDIA_VISIBLE_DEVICES": "all",
                "HOME": "/",
                "VARIANT": "v5",
                "NEURON_QWEN3_HOME": "/src",
            }
        )
        == []
    )


def test_log_rank_picks_whose_output_shows():
    def filtered(**env):
        argv = build({"SCALE": "smoke", **env}).argv
        return argv[argv.index("--local-ranks-filter") + 1] if "--local-ranks-filter" in argv else None

    assert (filtered(), filtered(LOG_RANK="0,3"), filtered(LOG_RANK="all")) == ("0", "0,3", None)
    with pytest.raises(contract.UsageError, match="LOG_RANK='0,0' is not `all`, or local ranks like 0 or 0,3"):
        contract.parse({"LOG_RANK": "0,0"})


def test_device_cpu_runs_the_cpu_path_on_a_neuron_host(tmp_path):
    for n in range(2):
        (tmp_path / "dev" / f"neuron{n}").mkdir(parents=True)
    neuron = entrypoint("--dry-run", root=tmp_path, SCALE="smoke")
    cpu = entrypoint("--dry-run", root=tmp_path, SCALE="smoke", DEVICE="cpu")
    assert '"kind": "neuron"' in neuron.stdout and '"kind": "cpu"' in cpu.stdout
    assert '"--device=cpu"' in cpu.stdout and '"device": "cpu"' in cpu.stdout
    missing = entrypoint("--dry-run", root=tmp_path / "empty", SCALE="smoke", DEVICE="cuda")
    assert (missing.returncode, missing.stderr) == (
        2,
        "entrypoint: DEVICE=cuda but no cuda device is visible here (allowed: auto, neuron, cuda, cpu)\n",
    )


def test_full_scale_is_refused_on_cpu_unless_asked_for(tmp_path):
    result = entrypoint("--dry-run", root=tmp_path)
    assert (result.returncode, result.stderr.count("\n")) == (2, 1)
    assert "set SCALE=smoke for the tiny model, or SCALE=full to train the full model on CPU knowingly" in result.stderr
    assert entrypoint("--dry-run", root=tmp_path, SCALE="full").returncode == 0


def test_check_runs_every_preflight_check_and_creates_nothing(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    ok = entrypoint("--check", cwd=work, root=tmp_path, SCALE="smoke", CHECKPOINT_DIR="ckpt")
    assert ok.returncode == 0, ok.stderr
    samples, gathering, checkpoints, dataset, verdict = ok.stdout.splitlines()
    assert samples.startswith("entrypoint: samples: 3 prompts answered")  # the smoke config's bundled prompts
    assert gathering.startswith("entrypoint: samples: weights gathered once a round: ")  # CPU: not budgeted
    assert checkpoints == f"entrypoint: checkpoints: none complete in {work}/ckpt: starting at step 0"
    assert re.fullmatch(r"entrypoint: dataset: \d+ records in /\S+/assets/corpus\S*", dataset), dataset
    assert verdict == "entrypoint: check: the launch would start: native_qwen3_smoke on 1 CPU cores"
    assert list(work.iterdir()) == []  # no outputs/, cache/, assets/ or ckpt/ made
    (work / "ckpt").write_text("")
    bad = entrypoint("--check", cwd=work, root=tmp_path, SCALE="smoke", CHECKPOINT_DIR="ckpt")
    assert bad.returncode == 2
    assert f"entrypoint: {work}/ckpt (CHECKPOINT_DIR) is a file, not a folder" in bad.stderr
    assert "the launch would stop" in bad.stdout
    assert sorted(p.name for p in work.iterdir()) == ["ckpt"]


def test_a_wrong_torchtitan_flag_is_one_line_naming_the_nearest_before_anything_starts(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "dev" / "shm").mkdir(parents=True)
    result = entrypoint("--check", "--optimizer.lr", "2e-5", cwd=work, root=tmp_path, SCALE="smoke")
    assert result.returncode == 2 and result.stderr.splitlines() == [
        "entrypoint: torchtitan arguments: Unrecognized options: --optimizer.lr, 2e-5 (nearest: "
        "--optimizer.param-groups.0.optimizer-kwargs.lr)"
    ], result.stderr
    # a launch, and `--flag=value`, which tyro matches whole: the nearest come from the split
    result = entrypoint(cwd=work, root=tmp_path, SCALE="smoke", EXTRA_ARGS="--optimizer.lr=1")
    assert result.returncode == 2 and result.stderr.splitlines() == [
        "entrypoint: torchtitan arguments: Unrecognized options: --optimizer.lr=1 (nearest: "
        "--optimizer.param-groups.0.optimizer-kwargs.lr)"
    ], result.stderr
    assert "torch.distributed.run" not in result.stdout
    bad_value = entrypoint("--check", "--training.steps", "ten", cwd=work, root=tmp_path, SCALE="smoke")
    assert bad_value.returncode == 2 and bad_value.stderr.splitlines() == [
        "entrypoint: torchtitan arguments: Error parsing --training.steps: invalid literal for int() with base 10: "
        "'ten'"
    ]
