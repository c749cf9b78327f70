"""Multi-node rendezvous from the environment: plain variables, Kubeflow Trainer's PET_*, Slurm's SLURM_*.

Run: .venv/bin/python -m pytest tests/test_entrypoint_rendezvous.py -q
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint import contract, plan, rendezvous
from entrypoint.discovery import Devices

REPO = Path(__file__).resolve().parent.parent
VAR = {var.name: var for var in contract.VARS}
NEURON = Devices("neuron", 64, tuple(f"neuron{i}" for i in range(16)), 2)


def resolve(**env):
    return rendezvous.resolve(contract.parse(env))


def test_one_node_keeps_the_articles_endpoint():
    for env in (
        {},
        {"NNODES": "1"},
        {"PET_NNODES": "1", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "x"},
        {"SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "trn-001"},
        {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"},
    ):
        found = resolve(**env)
        assert (found.nnodes, found.node_rank, found.endpoint) == (1, 0, "127.0.0.1:0"), env
        # the loopback address, never the host name: it does not resolve under `docker run --network none`
        assert found.torchrun_args() == [
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            "127.0.0.1:0",
            "--local-addr",
            "127.0.0.1",
        ]


def test_plain_variables():
    found = resolve(NNODES="4", NODE_RANK="2", MASTER_ADDR="head.example", MASTER_PORT="1234", RDZV_ID="run-7")
    assert (found.nnodes, found.node_rank, found.endpoint, found.run_id) == (4, 2, "head.example:1234", "run-7")
    assert found.torchrun_args() == [
        "--nnodes=4",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "head.example:1234",
        "--rdzv_id",
        "run-7",
        "--rdzv_conf",
        "is_host=false,join_timeout=600,read_timeout=600",
    ]
    assert resolve(NNODES="2", NODE_RANK="0", MASTER_ADDR="h").torchrun_args()[-1].startswith("is_host=true,")
    assert resolve(NNODES="2", NODE_RANK="1", MASTER_ADDR="h").endpoint == f"h:{rendezvous.DEFAULT_PORT}"
    assert resolve(NNODES="2", NODE_RANK="1", MASTER_ADDR="fd00::1").endpoint == "[fd00::1]:29500"


def test_kubeflow_trainer():
    pet = dict(
        PET_NNODES="2",
        PET_NODE_RANK="1",
        PET_MASTER_ADDR="qwen3-native-node-0-0.qwen3-native",
        PET_MASTER_PORT="29400",
        PET_NPROC_PER_NODE="auto",
    )
    found = resolve(**pet)
    assert (found.nnodes, found.node_rank, found.endpoint, found.nproc_per_node) == (
        2,
        1,
        "qwen3-native-node-0-0.qwen3-native:29400",
        None,
    )
    assert found.sources["master_addr"] == "PET_MASTER_ADDR"
    assert found.run_id == resolve(**{**pet, "PET_NODE_RANK": "0"}).run_id  # every node of the job meets
    assert found.run_id.startswith("neuron-qwen3-") and found.sources["run_id"] == "the node count and endpoint"


@pytest.mark.parametrize(
    "other", [{"PET_MASTER_ADDR": "other-job-node-0-0.other-job"}, {"PET_MASTER_PORT": "29501"}, {"PET_NNODES": "3"}]
)
def test_the_default_rendezvous_id_differs_between_endpoints_and_node_counts(other):
    pet = dict(PET_NNODES="2", PET_NODE_RANK="1", PET_MASTER_ADDR="job-node-0-0.job")
    assert resolve(**pet).run_id != resolve(**{**pet, **other}).run_id


@pytest.mark.parametrize("other", [{"STEPS": "5"}, {"EXTRA_ARGS": "--x 1"}, {"VARIANT": "nki_moe"}])
def test_nodes_with_different_settings_share_the_default_id(other):
    """They meet, and their workers name the setting that differs (same_config.py), instead of each waiting out
    the join timeout alone."""
    pet = dict(PET_NNODES="2", PET_NODE_RANK="1", PET_MASTER_ADDR="job-node-0-0.job")
    assert resolve(**pet).run_id == resolve(**{**pet, **other}).run_id


def test_rdzv_timeout_is_the_join_and_read_timeout():
    found = resolve(NNODES="2", NODE_RANK="0", MASTER_ADDR="h", RDZV_TIMEOUT="45")
    assert found.torchrun_args()[-1] == "is_host=true,join_timeout=45,read_timeout=45"
    assert "--rdzv_conf" not in resolve(RDZV_TIMEOUT="45").torchrun_args()  # one node: nobody to wait for


def test_local_addr_for_a_node_of_a_multi_node_job():
    found = resolve(NNODES="2", NODE_RANK="1", MASTER_ADDR="h", LOCAL_ADDR="10.0.3.7")
    assert found.torchrun_args()[-2:] == ["--local-addr", "10.0.3.7"]
    assert "--local-addr" not in resolve(NNODES="2", NODE_RANK="1", MASTER_ADDR="h").torchrun_args()


def test_slurm_first_host_of_the_node_list():
    found = resolve(SLURM_NNODES="4", SLURM_NODEID="3", SLURM_JOB_NODELIST="trn-[001-003,007]", SLURM_JOB_ID="4242")
    assert (found.nnodes, found.node_rank, found.endpoint, found.run_id) == (4, 3, "trn-001:29500", "4242")
    assert found.sources == {
        "nnodes": "SLURM_NNODES",
        "node_rank": "SLURM_NODEID",
        "master_addr": "SLURM_JOB_NODELIST",
        "master_port": "default",
        "run_id": "SLURM_JOB_ID",
    }
    two_groups = resolve(SLURM_NNODES="3", SLURM_NODEID="0", SLURM_JOB_NODELIST="b[07-08],a1")
    assert two_groups.endpoint == "b07:29500"


def test_plain_variables_win_field_by_field():
    found = resolve(
        SLURM_NNODES="2",
        SLURM_NODEID="1",
        SLURM_JOB_NODELIST="trn-[1-2]",
        SLURM_JOB_ID="9",
        MASTER_PORT="4000",
        PET_MASTER_ADDR="pet-host",
        RDZV_ID="mine",
    )
    assert (found.endpoint, found.run_id) == ("pet-host:4000", "mine")
    assert resolve(NNODES="2", NODE_RANK="0", PET_NNODES="8", PET_NODE_RANK="5", MASTER_ADDR="h").nnodes == 2


@pytest.mark.parametrize(
    "raw, hosts",
    [
        ("trn-[001-003,007]", ("trn-001", "trn-002", "trn-003", "trn-007")),
        ("node7", ("node7",)),
        ("a[8-10]", ("a8", "a9", "a10")),
        ("a[08-10],b[1,3]", ("a08", "a09", "a10", "b1", "b3")),
        ("rack[1-2]-n[01-02]", ("rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02")),
        ("ip-10-0-0-[1-2].ec2.internal", ("ip-10-0-0-1.ec2.internal", "ip-10-0-0-2.ec2.internal")),
    ],
)
def test_slurm_node_list_expansion(raw, hosts):
    assert contract.parse({"SLURM_JOB_NODELIST": raw}).slurm_job_nodelist == hosts


BAD = [
    ("NNODES", "0"),
    ("NNODES", "two"),
    ("NODE_RANK", "-1"),
    ("MASTER_ADDR", "bad host"),
    ("MASTER_ADDR", ""),
    ("MASTER_PORT", "0"),
    ("MASTER_PORT", "65536"),
    ("MASTER_PORT", "http"),
    ("RDZV_ID", "a b"),
    ("PET_NNODES", "1:4"),
    ("PET_NODE_RANK", "x"),
    ("PET_MASTER_PORT", "-1"),
    ("PET_NPROC_PER_NODE", "gpu"),
    ("PET_NPROC_PER_NODE", "0"),
    ("SLURM_NNODES", ""),
    ("SLURM_NODEID", "a"),
    ("SLURM_JOB_NODELIST", "trn-[3-1]"),
    ("SLURM_JOB_NODELIST", "trn-[1-2"),
    ("SLURM_JOB_NODELIST", "a,,b"),
    ("SLURM_JOB_NODELIST", "a[]"),
    ("SLURM_JOB_NODELIST", "a[1-]"),
    ("SLURM_JOB_NODELIST", "a[x]"),
    ("SLURM_JOB_NODELIST", "a]b"),
    ("SLURM_JOB_NODELIST", "a[[1]]"),
    ("SLURM_JOB_NODELIST", "a[1],"),
    ("SLURM_JOB_NODELIST", ",a"),
    ("SLURM_JOB_ID", "1 2"),
    ("LOCAL_ADDR", "bad host"),
    ("RDZV_TIMEOUT", "0"),
    ("RDZV_TIMEOUT", "10m"),
    ("PEER_TIMEOUT", "0"),
    ("PEER_TIMEOUT", "-5"),
]


@pytest.mark.parametrize("name, raw", BAD)
def test_bad_values_are_one_line_errors(name, raw):
    with pytest.raises(contract.UsageError) as error:
        contract.parse({name: raw})
    assert str(error.value) == f"{name}={raw!r} is not {VAR[name].allowed}"


@pytest.mark.parametrize(
    "env, words",
    [
        ({"NNODES": "2", "MASTER_ADDR": "h"}, ["NNODES=2", "rank is unset", "NODE_RANK"]),
        ({"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "h"}, ["NODE_RANK=2", "2-node", "0-1"]),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "5", "PET_MASTER_ADDR": "h"}, ["PET_NODE_RANK=5", "PET_NNODES"]),
        ({"NNODES": "2", "NODE_RANK": "1"}, ["NNODES=2", "no rendezvous host", "MASTER_ADDR"]),
        ({"NODE_RANK": "1"}, ["NODE_RANK=1", "one node"]),
        ({"SLURM_NNODES": "3", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "a[1-2]"}, ["SLURM_NNODES=3", "2 hosts"]),
    ],
)
def test_inconsistent_settings_are_one_line_errors(env, words):
    with pytest.raises(contract.UsageError) as error:
        resolve(**env)
    assert "\n" not in str(error.value) and all(word in str(error.value) for word in words), str(error.value)


def test_plan_for_a_node_of_a_kubeflow_job():
    env = dict(
        PET_NNODES="2",
        PET_NODE_RANK="0",
        PET_MASTER_ADDR="job-node-0-0.job",
        PET_MASTER_PORT="29500",
        PET_NPROC_PER_NODE="auto",
    )
    built = plan.build(contract.parse(env), NEURON, env)
    assert built.nproc == 64  # auto: every NeuronCore found
    assert list(built.argv[3:14]) == [
        "--nproc_per_node=64",
        "--nnodes=2",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "job-node-0-0.job:29500",
        "--rdzv_id",
        built.rendezvous.run_id,
        "--rdzv_conf",
        "is_host=true,join_timeout=600,read_timeout=600",
        f"--shutdown-timeout={VAR['STOP_GRACE'].default}",
    ]
    assert plan.build(contract.parse({**env, "PET_NPROC_PER_NODE": "16"}), NEURON, env).nproc == 16
    assert plan.build(contract.parse({**env, "PET_NPROC_PER_NODE": "16", "NPROC": "8"}), NEURON, env).nproc == 8
    with pytest.raises(contract.UsageError, match="PET_NPROC_PER_NODE=65 is more than the 64 logical NeuronCores"):
        plan.build(contract.parse({**env, "PET_NPROC_PER_NODE": "65"}), NEURON, env)


def test_dry_run_under_slurm_shows_the_rendezvous(tmp_path):
    env = {
        "PATH": os.environ["PATH"],
        "DEVICE": "cpu",
        "SLURM_NNODES": "2",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NODELIST": "trn-[001-002]",
        "SLURM_JOB_ID": "77",
        "SCALE": "smoke",
    }
    result = subprocess.run(
        [sys.executable, "-m", "entrypoint", "--dry-run"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert '"endpoint": "trn-001:29500"' in result.stdout and '"is_host=false,join_timeout=600' in result.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "entrypoint", "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**env, "SLURM_JOB_NODELIST": "trn-[2-1]"},
        timeout=60,
    )
    assert (bad.returncode, bad.stdout, bad.stderr.count("\n")) == (2, "", 1)
    assert "SLURM_JOB_NODELIST='trn-[2-1]'" in bad.stderr
