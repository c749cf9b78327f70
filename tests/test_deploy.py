"""The deploy files: the Kubeflow TrainJob and its runtime, the sbatch script (with stand-in srun/scontrol), and the
production docs' variable table. No cluster: the real-Slurm runs are tests/test_slurm_nodes.py's.

Run: .venv/bin/python -m pytest tests/test_deploy.py -q
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO

from entrypoint import contract
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
    return job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"][
        "spec"
    ]["template"]["spec"]


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
        entry = re.search(r"^ENTRYPOINT (\[.*\])", dockerfile, re.M)
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
    assert (
        node["template"]["spec"]["template"]["spec"]["containers"][0]["name"]
        == pod_spec(trainjob)["containers"][0]["name"]
    )


def test_manifests_set_steps_and_a_folder_per_run(trainjob):
    env = {e["name"]: e for e in trainjob["spec"]["trainer"]["env"]}
    assert int(env["STEPS"]["value"]) > int(env["CHECKPOINT_INTERVAL"]["value"])  # set, and past a checkpoint
    assert env["RUN_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['jobset.sigs.k8s.io/jobset-uid']"
    names = list(env)
    for name in ("OUTPUT_DIR", "CHECKPOINT_DIR", "EXPORT_DIR"):
        assert "/$(RUN_ID)" in env[name]["value"] and names.index("RUN_ID") < names.index(name), name
    sbatch = SBATCH.read_text()
    assert re.search(r"^RUN=\$\{RUN:-\$\{SLURM_JOB_NAME:-qwen3\}-\$\{SLURM_JOB_ID", sbatch, re.M), (
        "a requeued job keeps its id (resumes); a new submission gets a new folder"
    )
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
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
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
node=0
for code in ${FAKE_TASK_STATUSES:-}; do  # each task's launcher exits with its code, through the script's wrapper
    SLURM_NODEID=$node "$1" "$2" "$3" "$4" sh -c "exit $code"
    node=$((node + 1))
done
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
    return {
        "FAKE_SCONTROL_LOG": str(tmp_path / "scontrol"),
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "FAKE_SRUN_LOG": str(tmp_path / "srun"),
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "trn-[001-002]",
        "SLURM_JOB_ID": "4242",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NAME": "qwen3",
        "SHARED": str(tmp_path / "fsx"),
    }


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
    result = subprocess.run(
        ["bash", str(SBATCH)], env={**srun, "FAKE_SRUN_STATUS": str(status)}, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == status
    assert (tmp_path / "scontrol").exists() is requeued
    if requeued:
        assert (tmp_path / "scontrol").read_text().split() == ["requeue", "4242"]


@pytest.mark.parametrize("tasks, status, requeued", [("143 143", 143, True), ("1 143", 1, False), ("143 2", 2, False)])
def test_sbatch_requeues_only_when_every_node_stopped(srun, tmp_path, tasks, status, requeued):
    """srun returns the highest status; when one node fails, --kill-on-bad-exit SIGTERMs the others (143)."""
    env = {**srun, "IMAGE": "", "NEURON_QWEN3_HOME": str(REPO), "FAKE_SRUN_STATUS": "143", "FAKE_TASK_STATUSES": tasks}
    result = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == status, result.stderr
    assert (tmp_path / "scontrol").exists() is requeued
    assert sorted(p.name for p in (tmp_path / "fsx" / "outputs" / "qwen3-4242" / ".status").iterdir()) == ["0", "1"]


def test_sbatch_without_image_gives_the_launcher_a_slurm_rendezvous(srun, tmp_path):
    env = {
        **srun,
        "IMAGE": "",
        "NEURON_QWEN3_HOME": str(REPO),
        "PYTHON": sys.executable,
        "FAKE_SRUN_EXEC": "1",
        "FAKE_NODEID": "1",
        "DEVICE": "cpu",
    }
    result = subprocess.run(["bash", str(SBATCH), "--dry-run"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["rendezvous"]["endpoint"] == "trn-001:29500" and shown["rendezvous"]["run_id"] == "4242"
    assert (shown["rendezvous"]["nnodes"], shown["rendezvous"]["node_rank"]) == (2, 1)
    assert shown["checkpoint_dir"] == f"{tmp_path}/fsx/outputs/qwen3-4242/checkpoint"  # the job's own folder
    assert "--max-restarts=1" in shown["argv"] and "is_host=false,join_timeout=600,read_timeout=600" in shown["argv"]
