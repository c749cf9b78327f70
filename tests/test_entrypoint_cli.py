"""`python -m entrypoint` as the container runs it: exit codes, one-line errors, dry runs, signals, no torch.

Subprocess tests get a controlled environment and a fake device root (cli.main's `root`, conftest.launcher_at).
Run: .venv/bin/python -m pytest tests/test_entrypoint_cli.py -q
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOTED
from entrypoint import cli, contract, hygiene, launch, preflight
from entrypoint.variants import VARIANTS
from neuron_qwen3.shapes import MODELS

REPO = Path(__file__).resolve().parent.parent
VAR = {var.name: var for var in contract.VARS}
HAS_TORCH_NEURONX = bool(
    subprocess.run(
        [sys.executable, "-c", "import importlib.util as u, sys; sys.exit(not u.find_spec('torch_neuronx'))"]
    ).returncode
    == 0
)


def entrypoint(*args, root, python_flags=(), **env):
    return subprocess.run(
        [sys.executable, *python_flags, "-c", ROOTED, str(root), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ["PATH"], **env},
    )


def neuron_tree(root, devices=0, *names):
    (root / "dev").mkdir()
    for name in [f"neuron{i}" for i in range(devices)] + list(names):
        (root / "dev" / name).touch()
    return root


BAD = [
    ("VARIANT", "foo"),
    ("SCALE", "huge"),
    ("COMPILE", "maybe"),
    ("STEPS", "abc"),
    ("STEPS", "0"),
    ("STEPS", "-2"),
    ("NPROC", "four"),
    ("NPROC", "0"),
    ("NEURON_LOGICAL_NC_CONFIG", "4"),
    ("NEURON_RT_VISIBLE_CORES", "3-0"),
    ("NEURON_RT_VISIBLE_CORES", "1,1"),
    ("NEURON_RT_VISIBLE_CORES", "x"),
    ("EXTRA_ARGS", '"unclosed'),
]


@pytest.mark.parametrize("dry_run", [(), ("--dry-run",)], ids=["launch", "dry-run"])
@pytest.mark.parametrize("name, raw", BAD)
def test_bad_input_is_one_line_and_status_2(tmp_path, name, raw, dry_run):
    result = entrypoint(*dry_run, root=tmp_path, **{name: raw})
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"entrypoint: {name}={raw!r} is not {VAR[name].allowed}\n"


def test_error_lines_redact_the_token(tmp_path):
    result = entrypoint(root=tmp_path, HF_TOKEN="hf_do_not_print", EXTRA_ARGS="--token hf_do_not_print 'open")
    assert result.returncode == 2
    assert result.stderr == 'entrypoint: EXTRA_ARGS="--token *** \'open" is not shell words\n'


@pytest.mark.parametrize(
    "devices, env, words",
    [
        (4, {"NPROC": "17"}, ["NPROC=17", "16 logical NeuronCores", "1-16"]),
        (4, {"NEURON_RT_VISIBLE_CORES": "0-16"}, ["NEURON_RT_VISIBLE_CORES", "core 16", "0-15"]),
        (0, {"NPROC": str(os.cpu_count() + 1), "SCALE": "smoke"}, [f"NPROC={os.cpu_count() + 1}", "CPU cores"]),
    ],
)
def test_impossible_requests_are_one_line_and_status_2(tmp_path, devices, env, words):
    result = entrypoint("--dry-run", root=neuron_tree(tmp_path, devices), **env)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert all(word in result.stderr for word in words), result.stderr


def test_gap_in_device_numbers(tmp_path):
    result = entrypoint("--dry-run", root=neuron_tree(tmp_path, 2, "neuron3"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "/dev/neuron2 is missing" in result.stderr


def test_dry_run_on_four_neuron_devices_needs_no_torch_neuronx(tmp_path):
    result = entrypoint(
        "--dry-run",
        root=neuron_tree(tmp_path, 4),
        HF_TOKEN="hf_do_not_print",
        EXTRA_ARGS="--metrics.save_tb_folder hf_do_not_print",
    )
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert (shown["devices"]["kind"], shown["devices"]["count"], shown["nproc"]) == ("neuron", 16, 16)
    assert "--nproc_per_node=16" in shown["argv"] and shown["argv"][-1] == "***"
    assert shown["env"]["NEURON_LOGICAL_NC_CONFIG"] == "2"
    assert "hf_do_not_print" not in result.stdout + result.stderr
    config = shown["torchtitan_config"]  # the config the workers will run, from the recipes' own pass
    assert (config["device"], config["report"]["config"], config["training"]["steps"]) == (
        "neuron",
        "native_qwen3_4b",
        10,
    )
    assert shown["model_size"]["parameters"] == 4022468096 and shown["model_size"]["fits"]


def test_dry_run_at_full_scale_on_cpu_says_it_computes_in_float32(tmp_path):
    """The workers' device set-up makes a full-scale config float32 on CPU (finish.cpu_float32); the dry run
    shows the config as they will run it and says why. PYTHONPATH: a worktree's recipes, not the installed ones."""
    result = entrypoint(
        "--dry-run",
        root=neuron_tree(tmp_path),
        SCALE="full",
        VARIANT="nki_moe",
        PYTHONPATH=os.environ.get("PYTHONPATH", ""),
    )
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert [line.split(" (")[0] for line in shown["notes"]] == ["precision: float32"], shown["notes"]
    config = shown["torchtitan_config"]
    assert (config["device"], config["training"]["mixed_precision_param"]) == ("cpu", "float32")
    assert config["override"]["imports"] == [
        [
            "neuron_qwen3.moe.experts.nki_grouped_experts",  # as the workers
            {"kernel": "auto", "logical_nc_config": 2, "compute_dtype": "float32"},
        ]
    ]


@pytest.mark.skipif(HAS_TORCH_NEURONX, reason="torch_neuronx is installed here")
def test_launch_on_neuron_devices_without_torch_neuronx_is_refused(tmp_path):
    result = entrypoint(root=neuron_tree(tmp_path, 4))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.count("\n") == 1 and "torch_neuronx" in result.stderr


def test_dry_run_does_not_import_torch(tmp_path):
    result = entrypoint("--dry-run", root=neuron_tree(tmp_path, 1), python_flags=("-X", "importtime"))
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    modules = [line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")]
    assert "entrypoint.plan" in modules
    assert not [m for m in modules if m.split(".")[0] in ("torch", "torch_neuronx", "torchtitan", "huggingface_hub")]


def test_every_launcher_module_is_stdlib_only():
    """The launch path (preflight, checkpoints, assets, rendezvous, launch) imports nothing outside the stdlib."""
    code = (
        "import sys, sysconfig; import entrypoint.cli, entrypoint.preflight, "
        "entrypoint.rendezvous, entrypoint.launch, entrypoint.lease; "
        "roots = {sysconfig.get_path(k) for k in ('stdlib', 'platstdlib')}; "
        "print('\\n'.join(m.__file__ for m in list(sys.modules.values()) if getattr(m, '__file__', None) "
        "and not any(m.__file__.startswith(r) for r in roots)))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    outside = [path for path in result.stdout.split() if not path.startswith(str(REPO / "entrypoint"))]
    assert outside == []


def test_list_and_help(tmp_path):
    listed = entrypoint("--list", root=tmp_path).stdout.splitlines()
    for line, variant in zip(listed, VARIANTS.values()):
        assert line.startswith(variant.name) and variant.summary in line
        assert all(config in line for config in (*variant.configs.values(), variant.model_config))
    assert [line.split()[0] for line in listed[len(VARIANTS) + 2 :]] == list(MODELS)
    helped = entrypoint("--help", root=tmp_path)
    assert helped.returncode == 0
    for var in contract.VARS:  # the name, its default, what it accepts and the flag it sets, as the docs' tables
        flag = f"; sets {var.flag}" if var.flag else ""
        assert f"  {var.name}  (default: {var.default or '-'}; accepts: {var.allowed}{flag})" in helped.stdout


def test_launch_line_redacts_the_token_and_returns_the_child_status(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launch, "watch", lambda: None)  # leave pytest's own signal handlers alone
    environ = {
        "PATH": os.environ["PATH"],
        "HF_TOKEN": "hf_do_not_print",
        "EXTRA_ARGS": "--x.y hf_do_not_print",
        "SCALE": "smoke",
        "CACHE_DIR": str(tmp_path / "cache"),
        "OUTPUT_DIR": str(tmp_path / "out"),
        "PREFLIGHT": "warn",
    }  # --x.y is no flag of the config: the pre-launch pass says so, as a warning here
    launched = []
    monkeypatch.setattr(launch, "run", lambda argv, env, grace, peer: launched.append((argv, env, grace, peer)) or 5)
    assert cli.main([], environ, root=str(tmp_path)) == 5
    line, err = capsys.readouterr()
    assert line.count("\n") == 1 and "torch.distributed.run" in line
    assert "hf_do_not_print" not in line + err and line.rstrip().endswith("--x.y ***")
    assert "warning: torchtitan arguments: Unrecognized options: --x.y, ***" in err
    assert "HF_TOKEN" not in launched[0][1]  # only the asset fetch gets it
    assert launched[0][2] == int(VAR["STOP_GRACE"].default)
    assert launched[0][3] is None  # one node: no rendezvous host to watch


def test_every_node_but_0_watches_the_rendezvous_host(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "watch", lambda: None)
    environ = {
        "PATH": os.environ["PATH"],
        "SCALE": "smoke",
        "CACHE_DIR": str(tmp_path / "cache"),
        "OUTPUT_DIR": str(tmp_path / "out"),
        "NNODES": "2",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "29400",
        "PEER_TIMEOUT": "42",
        "PREFLIGHT": "warn",
    }
    peers = []
    monkeypatch.setattr(launch, "run", lambda argv, env, grace, peer: peers.append((peer, argv)) or 0)
    monkeypatch.setattr(preflight, "recipes_pass", lambda *args, **kwargs: ([], {}))  # its checks: elsewhere
    for rank in ("0", "1"):
        assert cli.main([], {**environ, "NODE_RANK": rank}, root=str(tmp_path)) == 0
    assert [peer for peer, _ in peers] == [None, ("10.0.0.7:29400", 42)]  # node 0 hosts the store
    assert all("--comm.train_timeout_seconds=42" in argv for _, argv in peers)  # every collective's bound too


CHILD = """
import os, signal, subprocess, sys, time
out, role = sys.argv[1], sys.argv[2]
def on_term(signum, frame):
    with open(os.path.join(out, role), "w") as f:
        f.write(str(signum))
    if role == "child":
        grandchild.wait()
    sys.exit(7 if role == "child" else 0)
signal.signal(signal.SIGTERM, on_term)
if role == "child":
    grandchild = subprocess.Popen([sys.executable, __file__, out, "grandchild"])
    while not os.path.exists(os.path.join(out, "grandchild.ready")):
        time.sleep(0.01)
with open(os.path.join(out, role + ".ready"), "w") as f:
    f.write(str(os.getpgid(0)))
while True:
    time.sleep(0.1)
"""


def run_launcher(*child):
    code = "import sys; from entrypoint.launch import run; sys.exit(run(sys.argv[1:], None, grace=20))"
    return subprocess.Popen([sys.executable, "-c", code, sys.executable, *child], cwd=REPO)


def test_sigterm_reaches_child_and_grandchild_and_status_is_the_childs(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    launcher = run_launcher(str(script), str(tmp_path), "child")
    deadline = time.monotonic() + 30
    while not (tmp_path / "child.ready").exists():
        assert time.monotonic() < deadline and launcher.poll() is None, "child never got ready"
        time.sleep(0.01)
    try:
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=10) == 143  # the child's 7 after a stop reads as stopped by SIGTERM
        assert (tmp_path / "child").read_text() == (tmp_path / "grandchild").read_text() == str(int(signal.SIGTERM))
    finally:  # on failure, leave no process behind
        launcher.kill()
        try:
            os.killpg(int((tmp_path / "child.ready").read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("code, status", [("raise SystemExit(3)", 3), ("import os; os.kill(os.getpid(), 9)", 137)])
def test_child_status_is_returned_unchanged(code, status):
    assert run_launcher("-c", code).wait(timeout=30) == status


NEURON_LS_STUB = """#!/bin/sh
touch "$STUB_DIR/neuron-ls.started"
while [ ! -e "$STUB_DIR/release" ]; do sleep 0.02; done
echo '[]'
"""


def test_sigterm_during_discovery_exits_143_and_launches_nothing(tmp_path):
    """The launcher is PID 1 while neuron-ls runs: a stop then used to be lost and the job started anyway."""
    stub = tmp_path / "bin" / "neuron-ls"
    stub.parent.mkdir()
    stub.write_text(NEURON_LS_STUB)
    stub.chmod(0o755)
    env = {
        "PATH": f"{stub.parent}:{os.environ['PATH']}",
        "STUB_DIR": str(tmp_path),
        "SCALE": "smoke",
        "OUTPUT_DIR": str(tmp_path / "out"),
        "CACHE_DIR": str(tmp_path / "cache"),
        "PREFLIGHT": "warn",
    }
    launcher = subprocess.Popen(
        [sys.executable, "-m", "entrypoint"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "neuron-ls.started").exists():
            assert time.monotonic() < deadline and launcher.poll() is None, "neuron-ls was never run"
            time.sleep(0.01)
        launcher.send_signal(signal.SIGTERM)
        time.sleep(0.1)  # let the handler run while neuron-ls is still busy
        (tmp_path / "release").touch()
        out, err = launcher.communicate(timeout=30)
        assert launcher.returncode == 143, err
        assert "torch.distributed.run" not in out + err and "Traceback" not in err
        assert "entrypoint: SIGTERM: stopping before the launch: nothing more is started" in err.splitlines()
    finally:
        launcher.kill()


def test_a_token_with_a_trailing_newline_is_redacted_too():
    """A Kubernetes secret made from a file keeps its newline; the token still shows up in text without it."""
    env = {"HF_TOKEN": "hf_from_a_file\n"}
    assert hygiene.redact("--x hf_from_a_file --y", env) == "--x *** --y"
    assert hygiene.redact(f"env HF_TOKEN={env['HF_TOKEN']}", env) == "env HF_TOKEN=***"
    assert hygiene.redact("nothing", {"HF_TOKEN": " \n"}) == "nothing"
