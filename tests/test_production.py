"""Production launch: the deploy files, two nodes on one machine, and preemption (SIGTERM, kill -9, damage).

The training tests are real torchrun runs of the native smoke config through `python -m entrypoint` on CPU (gloo),
a few tens of seconds each, about 3 minutes together on 2 cores. Kubernetes, Slurm, EFA and Neuron devices are
not here: the deploy files are checked against the TrainJob CRD's field names and the launcher's contract, and
the sbatch script runs with a stand-in `srun`. Run:
    .venv/bin/python -m pytest tests/test_production.py
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ANSI, REPO, STEP_LOSS

from entrypoint import checkpoints, contract, launch
from entrypoint.discovery import PHYSICAL_CORES_PER_DEVICE

DEPLOY = REPO / "deploy"
SCHEMA = Path(__file__).resolve().parent / "data" / "kubeflow-trainjob-v2.3.0.schema.json"
VARS = {var.name: var for var in contract.VARS}
# for the workers; RUN_ID only names the run's folders (Kubernetes expands $(RUN_ID) in the paths)
PASSED_THROUGH = {"HF_HOME", "FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_FORK_SAFE", "RUN_ID"}


# ---- Kubernetes --------------------------------------------------------------------------------


def schema_errors(value, schema, path="$"):
    """Errors of `value` against a structural OpenAPI v3 schema, the subset Kubernetes CRDs use."""
    if not schema or (schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema):
        return []
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, (int, str)) and not isinstance(value, bool)
        return [] if ok else [f"{path}: int or string expected"]
    types = {"object": dict, "array": list, "string": str, "integer": int, "boolean": bool, "number": (int, float)}
    kind = schema.get("type")
    if kind and (not isinstance(value, types[kind]) or (kind in ("integer", "number") and isinstance(value, bool))):
        return [f"{path}: {kind} expected, got {type(value).__name__}"]
    errors = [f"{path}: {value!r} not in {schema['enum']}"] if "enum" in schema and value not in schema["enum"] else []
    if isinstance(value, dict):
        errors += [f"{path}: required field {name} missing" for name in schema.get("required", ()) if name not in value]
        for key, item in value.items():
            if key in schema.get("properties", {}):
                errors += schema_errors(item, schema["properties"][key], f"{path}.{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += schema_errors(item, schema["additionalProperties"], f"{path}.{key}")
            elif "properties" in schema:
                errors.append(f"{path}: unknown field {key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{path}[{i}]")
    return errors


@pytest.fixture(scope="module")
def trainjob():
    return yaml.safe_load((DEPLOY / "kubernetes" / "trainjob.yaml").read_text())


def pod_spec(job):
    return job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]["spec"]


def test_trainjob_matches_the_kubeflow_trainer_crd(trainjob):
    schema = json.loads(SCHEMA.read_text())["schema"]
    assert schema_errors(trainjob, schema) == []
    broken = json.loads(json.dumps(trainjob))  # the check can fail: a v2.1-style field and a wrong type
    broken["spec"]["podTemplateOverrides"] = broken["spec"].pop("runtimePatches")
    broken["spec"]["trainer"]["numNodes"] = "2"
    assert len(schema_errors(broken, schema)) == 2


def test_trainjob_asks_for_whole_trn2_nodes(trainjob):
    trainer = trainjob["spec"]["trainer"]
    assert (trainjob["apiVersion"], trainjob["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", trainjob["metadata"]["name"])
    assert trainer["numNodes"] >= 2
    for part in ("requests", "limits"):
        assert trainer["resourcesPerNode"][part]["aws.amazon.com/neuron"] == 16
        assert trainer["resourcesPerNode"][part]["vpc.amazonaws.com/efa"] == 16
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    lnc = int(env.get("NEURON_LOGICAL_NC_CONFIG", VARS["NEURON_LOGICAL_NC_CONFIG"].default))
    assert trainer["numProcPerNode"] == 16 * PHYSICAL_CORES_PER_DEVICE // lnc  # every NeuronCore, one rank each
    assert pod_spec(trainjob)["nodeSelector"]["node.kubernetes.io/instance-type"] == "trn2.48xlarge"


def test_trainjob_runs_the_image_launcher_with_contract_variables(trainjob):
    trainer = trainjob["spec"]["trainer"]
    dockerfile = (REPO / "Dockerfile").read_text() if (REPO / "Dockerfile").exists() else ""
    if dockerfile:
        entry = re.search(r'^ENTRYPOINT (\[.*\])', dockerfile, re.M)
        assert trainer["command"] == json.loads(entry[1])
    assert trainer["command"] == ["python3", "-m", "entrypoint"]
    assert trainer["image"].rsplit("/", 1)[-1].split(":")[0] == "neuron-qwen3"  # what `make image` tags
    names = [e["name"] for e in trainer["env"]]
    assert len(names) == len(set(names))
    unknown = [name for name in names if name not in VARS and name not in PASSED_THROUGH]
    assert unknown == [], "not in the launcher's contract: " + ", ".join(unknown)
    env = {e["name"]: e.get("value") for e in trainer["env"] if "value" in e}
    contract.parse(env)  # every value is one the launcher accepts
    token = next(e for e in trainer["env"] if e["name"] == "HF_TOKEN")
    assert "value" not in token and token["valueFrom"]["secretKeyRef"]["optional"] is True


def test_trainjob_runs_on_our_runtime_which_restarts_the_job(trainjob):
    runtime = yaml.safe_load((DEPLOY / "kubernetes" / "runtime.yaml").read_text())
    assert (runtime["apiVersion"], runtime["kind"]) == ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime")
    assert trainjob["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    assert "torch" in runtime["spec"]["mlPolicy"]  # PET_* for the launcher, as the stock torch runtime
    jobset = runtime["spec"]["template"]["spec"]
    assert jobset["failurePolicy"]["maxRestarts"] >= 1, "one preempted pod would fail the whole TrainJob"
    node = jobset["replicatedJobs"][0]
    patched = trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert node["name"] == patched["name"] == "node"  # the TrainJob's pod settings land on this job
    assert node["template"]["spec"]["template"]["spec"]["containers"][0]["name"] == \
        pod_spec(trainjob)["containers"][0]["name"]


def test_manifests_set_steps_and_a_folder_per_run(trainjob):
    env = {e["name"]: e for e in trainjob["spec"]["trainer"]["env"]}
    assert int(env["STEPS"]["value"]) > int(env["CHECKPOINT_INTERVAL"]["value"])  # set, and past a checkpoint
    assert env["RUN_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['jobset.sigs.k8s.io/jobset-uid']"
    names = list(env)
    for name in ("OUTPUT_DIR", "CHECKPOINT_DIR", "EXPORT_DIR"):
        assert "/$(RUN_ID)" in env[name]["value"] and names.index("RUN_ID") < names.index(name), name
    sbatch = SBATCH.read_text()
    assert re.search(r"^RUN=\$\{RUN:-\$\{SLURM_JOB_NAME:-qwen3\}-\$\{SLURM_JOB_ID", sbatch, re.M), \
        "a requeued job keeps its id (resumes); a new submission gets a new folder"
    assert re.search(r"^export STEPS=\$\{STEPS:-(\d+)\}", sbatch, re.M)
    assert "HF_TOKEN" in sbatch


def test_trainjob_volumes_shm_and_stop_bound(trainjob):
    spec = pod_spec(trainjob)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    assert spec["containers"][0]["name"] == "node" and set(mounts.values()) == set(volumes)
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    env = {e["name"]: e.get("value") for e in trainjob["spec"]["trainer"]["env"]}
    for name in ("CACHE_DIR", "ASSETS_DIR", "OUTPUT_DIR", "CHECKPOINT_DIR"):
        mount = next((path for path in mounts if env[name] == path or env[name].startswith(path + "/")), None)
        assert mount and "persistentVolumeClaim" in volumes[mounts[mount]], f"{name}={env[name]} is not on a volume"
    assert int(env["STOP_GRACE"]) + 5 <= spec["terminationGracePeriodSeconds"]
    assert int(env["STOP_GRACE"]) >= 60  # the step in flight and a full-scale save on stop must fit
    assert spec["securityContext"]["fsGroup"] == 10001
    assert spec["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    assert spec["containers"][0]["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 10001, "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    claims = {v["persistentVolumeClaim"]["claimName"] for v in volumes.values() if "persistentVolumeClaim" in v}
    pvcs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "pvcs.yaml").read_text()))
    assert {p["metadata"]["name"] for p in pvcs} == claims
    assert all(p["kind"] == "PersistentVolumeClaim" and p["spec"]["accessModes"] == ["ReadWriteMany"] for p in pvcs)


# ---- Slurm -------------------------------------------------------------------------------------

SBATCH = DEPLOY / "slurm" / "train.sbatch"
FAKE_SRUN = """#!/bin/bash
# stand-in srun: record the options, then run the command as a task of node $FAKE_NODEID would
printf '%s\\n' "$@" > "$FAKE_SRUN_LOG"
while [[ $# -gt 0 && $1 == -* ]]; do shift; done
[[ -n ${FAKE_SRUN_EXEC:-} ]] && SLURM_NODEID=$FAKE_NODEID exec "$@"
exit ${FAKE_SRUN_STATUS:-0}
"""
FAKE_SCONTROL = """#!/bin/bash
printf '%s\\n' "$@" > "$FAKE_SCONTROL_LOG"
"""


def test_sbatch_script_parses():
    assert subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True).returncode == 0
    text = SBATCH.read_text()
    assert re.search(r"^#SBATCH --ntasks-per-node=1$", text, re.M) and re.search(r"^#SBATCH --requeue$", text, re.M)
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    first_command = next(i for i, line in enumerate(text.splitlines()) if line and not line.startswith("#"))
    assert all(text.splitlines().index(line) < first_command for line in directives)  # sbatch stops reading there


@pytest.fixture
def srun(tmp_path):
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "srun"
    fake.write_text(FAKE_SRUN)
    fake.chmod(0o755)
    (tmp_path / "bin" / "scontrol").write_text(FAKE_SCONTROL)
    (tmp_path / "bin" / "scontrol").chmod(0o755)
    return {"FAKE_SCONTROL_LOG": str(tmp_path / "scontrol"), "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", "FAKE_SRUN_LOG": str(tmp_path / "srun"),
            "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "trn-[001-002]", "SLURM_JOB_ID": "4242", "SLURM_NODEID": "0",
            "SLURM_JOB_NAME": "qwen3", "SHARED": str(tmp_path / "fsx")}


def test_sbatch_runs_the_image_launcher_through_pyxis(srun, tmp_path):
    result = subprocess.run(["bash", str(SBATCH), "--dry-run"], env=srun, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    args = (tmp_path / "srun").read_text().splitlines()
    assert f"--container-image={tmp_path}/fsx/neuron-qwen3.sqsh" in args
    assert f"--container-mounts={tmp_path}/fsx:/data" in args and "--ntasks-per-node=1" in args
    assert args[-4:] == ["python3", "-m", "entrypoint", "--dry-run"]


@pytest.mark.parametrize("status, requeued", [(143, True), (0, False), (1, False)])
def test_sbatch_asks_for_sigterm_before_the_limit_and_requeues_a_stopped_job(srun, tmp_path, status, requeued):
    assert re.search(r"^#SBATCH --signal=TERM@\d+$", SBATCH.read_text(), re.M)  # TERM: the launcher ignores USR1
    result = subprocess.run(["bash", str(SBATCH)], env={**srun, "FAKE_SRUN_STATUS": str(status)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == status
    assert (tmp_path / "scontrol").exists() is requeued
    if requeued:
        assert (tmp_path / "scontrol").read_text().split() == ["requeue", "4242"]


def test_sbatch_without_image_gives_the_launcher_a_slurm_rendezvous(srun, tmp_path):
    env = {**srun, "IMAGE": "", "NEURON_QWEN3_HOME": str(REPO), "PYTHON": sys.executable, "FAKE_SRUN_EXEC": "1",
           "FAKE_NODEID": "1", "NEURON_QWEN3_ROOT": str(tmp_path)}
    result = subprocess.run(["bash", str(SBATCH), "--dry-run"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["rendezvous"]["endpoint"] == "trn-001:29500" and shown["rendezvous"]["run_id"] == "4242"
    assert (shown["rendezvous"]["nnodes"], shown["rendezvous"]["node_rank"]) == (2, 1)
    assert shown["checkpoint_dir"] == f"{tmp_path}/fsx/outputs/qwen3-4242/checkpoint"  # the job's own folder
    assert "--max-restarts=1" in shown["argv"] and "is_host=false" in shown["argv"]


# ---- training through the launcher -------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One compile cache for the module: inductor kernels compiled by the first run are reused by the others."""
    return tmp_path_factory.mktemp("cache")


def launcher_env(tmp, cache, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_"))}
    return {**base, "VARIANT": "native", "SCALE": "smoke", "NPROC": "1", "OUTPUT_DIR": str(tmp / "out"),
            "CACHE_DIR": str(cache), **env}


def start(log, env):
    return subprocess.Popen([sys.executable, "-m", "entrypoint"], cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def losses(text):
    return [(int(step), float(loss)) for step, loss in STEP_LOSS.findall(ANSI.sub("", text))]


def wait_for(path, process, timeout=300):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"the launcher exited ({process.returncode}) before {path} appeared"
        assert time.monotonic() < deadline, f"no {path} after {timeout}s"
        time.sleep(0.05)


def descendants(pid):
    table = launch.process_table()
    found, stack = [], [pid]
    while stack:
        parent = stack.pop()
        children = [child for child, (ppid, _, _) in table.items() if ppid == parent]
        found += children
        stack += children
    return found


def running(pid):
    entry = launch.process_table().get(pid)
    return entry is not None and entry[2] != "Z"


def cleanup(process):
    """On a failure, leave nothing behind: the launcher and every process group below it."""
    for pgid in launch.process_groups(process.pid) | {process.pid}:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    process.wait()


@pytest.mark.training
def test_two_nodes_on_one_machine_train_together(tmp_path, cache):
    port = str(free_port())
    runs = []
    for rank in (0, 1):
        env = launcher_env(tmp_path / f"node{rank}", cache, NNODES="2", NODE_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=port, STEPS="4")
        log = open(tmp_path / f"node{rank}.log", "w")
        runs.append((start(log, env), log))
    try:
        codes = [process.wait(timeout=400) for process, _ in runs]
    finally:
        for process, _ in runs:
            cleanup(process)
    logs = [ANSI.sub("", (tmp_path / f"node{rank}.log").read_text()) for rank in (0, 1)]
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    for log in logs:
        assert "--nnodes=2" in log and f"--rdzv_endpoint 127.0.0.1:{port}" in log
        assert "dp_shard=2" in log  # one world of two ranks, one per node, not two worlds of one
    node0, node1 = losses(logs[0]), losses(logs[1])
    assert [step for step, _ in node0] == [1, 2, 3, 4] and node0 == node1  # the same global loss on both nodes
    assert node0[-1][1] < node0[0][1]


@pytest.mark.training
def test_sigterm_stops_within_the_bound_and_a_restart_resumes(tmp_path, cache):
    """SIGTERM mid-run; then, with a damaged newer checkpoint planted, a restart resumes from the last good step."""
    ckpt = tmp_path / "ckpt"
    env = launcher_env(tmp_path, cache, NPROC="2", STEPS="14", CHECKPOINT_DIR=str(ckpt), CHECKPOINT_INTERVAL="3",
                       STOP_GRACE="20")
    with open(tmp_path / "run1.log", "w") as log:
        first = start(log, env)
        try:
            wait_for(ckpt / "step-3" / ".metadata", first)
            workers = descendants(first.pid)
            started = time.monotonic()
            first.send_signal(signal.SIGTERM)
            code = first.wait(timeout=60)
            stopped = time.monotonic() - started
        finally:
            cleanup(first)
    run1 = ANSI.sub("", (tmp_path / "run1.log").read_text())
    print(f"SIGTERM to launcher exit: {stopped:.2f}s (bound: STOP_GRACE=20 s + 0.1 s)")
    assert code != 0 and stopped < 20 + 1, run1[-3000:]
    assert not [pid for pid in workers if running(pid)], "a worker outlived the launcher"
    done = [step for step, _ in losses(run1)]
    assert done and max(done) < 14, "the run finished before SIGTERM: nothing was interrupted"

    last_good = checkpoints.scan(ckpt).latest
    assert last_good is not None and last_good >= 3
    damaged = ckpt / f"step-{last_good + 3}"  # what a save cut short by a full disk could leave: all files, one short
    shutil.copytree(ckpt / f"step-{last_good}", damaged)
    data = next(damaged.glob("*.distcp"))
    os.truncate(data, data.stat().st_size // 2)

    second = subprocess.run([sys.executable, "-m", "entrypoint"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=400)
    run2 = ANSI.sub("", second.stdout + second.stderr)
    assert second.returncode == 0, run2[-3000:]
    warnings = [line for line in second.stderr.splitlines() if line.startswith("entrypoint: warning: checkpoint")]
    assert len(warnings) == 1 and f"step-{last_good + 3} is broken" in warnings[0], second.stderr[-2000:]
    assert f"entrypoint: checkpoints: resuming from step {last_good}" in second.stdout
    assert f"Loading the checkpoint from {ckpt}/step-{last_good}." in run2
    resumed = [step for step, _ in losses(run2)]
    assert resumed == list(range(last_good + 1, 15)), resumed  # not from step 1, and up to the target
    assert losses(run2)[0][1] < losses(run1)[0][1] - 0.3  # trained weights, not a fresh start
    assert (ckpt / "step-14" / ".metadata").exists()


@pytest.mark.training
def test_kill_9_of_a_worker_resumes_in_place_with_restarts_allowed(tmp_path, cache):
    ckpt = tmp_path / "ckpt"
    env = launcher_env(tmp_path, cache, NPROC="2", STEPS="10", CHECKPOINT_DIR=str(ckpt), CHECKPOINT_INTERVAL="3",
                       MAX_RESTARTS="1")
    with open(tmp_path / "run.log", "w") as log:
        process = start(log, env)
        try:
            wait_for(ckpt / "step-3" / ".metadata", process)
            torchrun = [pid for pid in descendants(process.pid) if launch.process_table()[pid][0] == process.pid][0]
            workers = [pid for pid in descendants(torchrun) if launch.process_table()[pid][0] == torchrun]
            assert len(workers) == 2
            os.kill(workers[-1], signal.SIGKILL)
            code = process.wait(timeout=400)
        finally:
            cleanup(process)
    log = ANSI.sub("", (tmp_path / "run.log").read_text())
    assert code == 0, log[-3000:]
    loaded = re.search(rf"Loading the checkpoint from {ckpt}/step-(\d+)\.", log)
    assert loaded and int(loaded[1]) >= 3, log[-3000:]  # the restarted workers found a checkpoint
    before, after = losses(log[:loaded.start()]), losses(log[loaded.end():])
    assert [step for step, _ in before][:1] == [1]  # the first attempt, killed after its first checkpoint
    assert [step for step, _ in after] == list(range(int(loaded[1]) + 1, 11))  # resumed there, not at step 1


# ---- the docs -----------------------------------------------------------------------------------


def test_production_docs_cover_every_variable_the_readme_does_not():
    doc = (REPO / "docs" / "production.md").read_text()
    missing = [name for name, var in VARS.items() if var.group not in contract.README_GROUPS and f"| `{name}` |" not in doc]
    assert missing == [], "docs/production.md lacks " + ", ".join(missing)
