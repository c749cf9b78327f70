"""Preflight's stdlib checks: each alone on made-up inputs, then through `python -m entrypoint` (one line, exit 2).

The checks that need the real libraries (flags, INIT_FROM, the dataset, checkpoints) are the recipes' pre-launch
pass: tests/test_preflight_pass.py. Run: .venv/bin/python -m pytest tests/test_entrypoint_preflight.py -q
"""

import os
import resource
import subprocess

import pytest

from conftest import REPO, launcher_at
from entrypoint import cli, contract, launch, plan, preflight
from entrypoint.discovery import Devices

NEURON = Devices("neuron", 64, tuple(f"neuron{i}" for i in range(16)), 2)
CPU = Devices("cpu", 2)


def build(devices=CPU, **env):
    """(plan, settings); SCALE=full said explicitly, as the full scale is refused on CPU by default."""
    env = {"SCALE": "full", **env}
    return plan.build(contract.parse(env), devices, env), contract.parse(env)


def entrypoint(root, *args, **env):
    return subprocess.run(
        launcher_at(root, *args),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ["PATH"], **env},
    )


# ---- Neuron runtime, LNC, cores held


def test_neuron_devices_without_torch_neuronx():
    neuron_plan, _ = build(NEURON)
    found = preflight.runtime(neuron_plan, find_spec=lambda name: None)
    assert len(found) == 1 and found[0].fatal and "16 Neuron devices found but the torch_neuronx" in found[0].text
    assert preflight.runtime(neuron_plan, find_spec=lambda name: object()) == []
    assert preflight.runtime(build(CPU)[0], find_spec=lambda name: None) == []


@pytest.mark.parametrize(
    "flags, lnc",
    [
        ("--lnc=1", "1"),
        ("-O1 --lnc 2", "2"),
        ("--logical-nc-config=1", "1"),
        ("--logical-nc-config 2 --model-type transformer", "2"),
        ("--lnc=1 --lnc=2", "2"),
        ("-O2", None),
        ("", None),
    ],
)
def test_compiler_lnc_forms(flags, lnc):
    assert preflight.compiler_lnc(contract.parse({"NEURON_CC_FLAGS": flags}).neuron_cc_flags) == lnc


def test_lnc_must_agree_with_the_runtime():
    mismatch = build(NEURON, NEURON_CC_FLAGS="--lnc=1", NEURON_LOGICAL_NC_CONFIG="2")
    found = preflight.lnc(*mismatch)
    assert len(found) == 1 and found[0].fatal
    assert "--lnc=1" in found[0].text and "NEURON_LOGICAL_NC_CONFIG=2" in found[0].text
    assert preflight.lnc(*build(NEURON, NEURON_CC_FLAGS="--lnc=2")) == []
    assert preflight.lnc(*build(NEURON)) == []
    assert preflight.lnc(*build(CPU, NEURON_CC_FLAGS="--lnc=1")) == []  # no Neuron device: nothing compiles for it


def test_cores_held_by_another_process():
    held = Devices("neuron", 8, ("neuron0", "neuron1"), 2, None, (("neuron1", 4242, "python3"),))
    found = preflight.held_cores(build(held)[0])
    assert len(found) == 1 and found[0].fatal and "neuron1 (pid 4242 python3)" in found[0].text
    # cores 0-3 sit on neuron0 at LNC 2: the process on neuron1 is in nobody's way
    visible = Devices("neuron", 4, ("neuron0", "neuron1"), 2, (0, 1, 2, 3), (("neuron1", 4242, "python3"),))
    assert preflight.held_cores(build(visible)[0]) == []
    visible_held = Devices("neuron", 1, ("neuron0", "neuron1"), 2, (5,), (("neuron1", 4242, "python3"),))
    assert preflight.held_cores(build(visible_held)[0])[0].fatal


# ---- limits


def shm_root(tmp_path):
    (tmp_path / "dev" / "shm").mkdir(parents=True)
    return tmp_path


def test_nofile_is_raised_to_the_hard_limit_when_it_can_be():
    calls = []
    found = preflight.limits(
        "/",
        getrlimit=lambda which: (1024, 1 << 20) if which == resource.RLIMIT_NOFILE else (resource.RLIM_INFINITY,) * 2,
        setrlimit=lambda which, value: calls.append((which, value)),
    )
    assert calls == [(resource.RLIMIT_NOFILE, (65536, 1 << 20))]
    assert not [f for f in found if "nofile" in f.text]


def test_low_limits_are_warnings(tmp_path):
    root = shm_root(tmp_path)
    (root / "dev" / "infiniband").mkdir()
    (root / "dev" / "infiniband" / "uverbs0").touch()
    found = preflight.limits(
        str(root),
        64,
        getrlimit=lambda which: (4096, 4096) if which == resource.RLIMIT_NOFILE else (64 << 10, 64 << 10),
        setrlimit=lambda *a: None,
    )
    texts = [f.text for f in found]
    assert not any(f.fatal for f in found)
    assert any("nofile) is 4096, below 65536" in t for t in texts)
    assert any("EFA devices are present" in t and "64 KiB" in t for t in texts)


def test_a_low_nofile_cannot_matter_to_a_few_processes_and_stays_quiet(tmp_path):
    found = preflight.limits(
        str(shm_root(tmp_path)),
        2,
        setrlimit=lambda *a: None,
        getrlimit=lambda which: (4096, 4096) if which == resource.RLIMIT_NOFILE else (resource.RLIM_INFINITY,) * 2,
    )
    assert found == []


def test_shm_size(tmp_path, monkeypatch):
    root = shm_root(tmp_path)
    fine = resource.RLIM_INFINITY

    def limits():
        return [f.text for f in preflight.limits(str(root), getrlimit=lambda which: (fine, fine))]

    class Small:
        f_blocks, f_frsize = 16384, 4096  # 64 MiB: Docker's default

    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda path: Small if str(path).endswith("dev/shm") else real(path))
    assert limits() == [
        "/dev/shm is 64 MiB, below 1024 MiB: dataloader workers and gloo may fail; docker run "
        "--shm-size=16g (or --ipc=host), a memory-backed emptyDir on Kubernetes"
    ]
    monkeypatch.setattr(os, "statvfs", real)
    assert limits() == []
    assert [
        t for t in [f.text for f in preflight.limits(str(tmp_path / "nothing"), getrlimit=lambda which: (fine, fine))]
    ] == ["no /dev/shm: mount one (docker run --shm-size=16g)"]


# ---- directories and assets


def test_cache_checkpoint_and_output_dirs_must_be_writable(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    built, settings = build(
        CACHE_DIR=str(blocker / "cache"),
        CHECKPOINT_DIR=str(tmp_path / "ckpt"),
        OUTPUT_DIR=str(tmp_path / "out"),
        VARIANT="v5",
    )
    found = preflight.writable(built, settings, {})
    assert len(found) == 1 and found[0].fatal
    assert f"{blocker}/cache/v5/inductor (TORCHINDUCTOR_CACHE_DIR) is below {blocker}, which is a file" in found[0].text
    assert "mount a writable volume at CACHE_DIR" in found[0].text
    assert sorted(tmp_path.iterdir()) == [blocker]  # judged by the folder above: nothing made


def test_a_checkpoint_dir_that_is_a_file_says_so(tmp_path):
    (tmp_path / "ckpt").write_text("")
    built, settings = build(CHECKPOINT_DIR=str(tmp_path / "ckpt"), OUTPUT_DIR=str(tmp_path / "out"))
    found = preflight.writable(built, settings, {})
    assert [f.text for f in found] == [
        f"{tmp_path}/ckpt (CHECKPOINT_DIR) is a file, not a folder; mount a writable volume at CHECKPOINT_DIR"
    ]


def test_neuron_cache_variables_are_checked_where_the_workers_will_use_them(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {
        "TORCH_NEURONX_NEFF_CACHE_DIR": str(blocker / "neff"),
        "NKI_COMPILE_CACHE_URL": "s3://bucket/nki",
        "CACHE_DIR": str(tmp_path / "cache"),
        "OUTPUT_DIR": str(tmp_path / "out"),
    }
    built, settings = build(NEURON, **env)
    found = preflight.writable(built, settings, env)
    assert [f.text.split(" (")[1].split(")")[0] for f in found] == ["TORCH_NEURONX_NEFF_CACHE_DIR"]
    assert not (tmp_path / "cache").exists()  # judged writable by tmp_path, not made


# ---- through the launcher


def test_offline_full_scale_without_assets_is_one_line_and_status_2(tmp_path):
    result = entrypoint(
        tmp_path,
        SCALE="full",
        HF_HUB_OFFLINE="1",
        ASSETS_DIR=str(tmp_path / "assets"),
        CACHE_DIR=str(tmp_path / "c"),
        OUTPUT_DIR=str(tmp_path / "o"),
    )
    assert (result.returncode, result.stdout, result.stderr.count("\n")) == (2, "", 1), result.stderr
    assert result.stderr.startswith(f"assets: {tmp_path}/assets/Qwen3-4B has no config.json")


def test_unwritable_cache_is_one_line_and_status_2(tmp_path):
    (tmp_path / "a-file").write_text("")
    result = entrypoint(tmp_path, SCALE="smoke", CACHE_DIR=str(tmp_path / "a-file"), OUTPUT_DIR=str(tmp_path / "o"))
    assert (result.returncode, result.stdout, result.stderr.count("\n")) == (2, "", 1), result.stderr
    assert "(TORCHINDUCTOR_CACHE_DIR) is below" in result.stderr and "which is a file" in result.stderr


def test_warn_mode_prints_the_failure_and_launches(tmp_path, monkeypatch, capsys):
    (tmp_path / "a-file").write_text("")
    environ = {
        "PATH": os.environ["PATH"],
        "SCALE": "smoke",
        "PREFLIGHT": "warn",
        "CACHE_DIR": str(tmp_path / "a-file"),
        "OUTPUT_DIR": str(tmp_path / "o"),
    }
    launched = []
    monkeypatch.setattr(launch, "run", lambda argv, env, grace, peer=None: launched.append(argv) or 0)
    assert cli.main([], environ, root=str(tmp_path)) == 0
    out, err = capsys.readouterr()
    assert "entrypoint: warning: " in err and "(TORCHINDUCTOR_CACHE_DIR) is below" in err
    assert "pre-launch pass failed" not in err
    assert len(launched) == 1 and "torch.distributed.run" in out
