"""Two Slurm nodes run deploy/slurm/train.sbatch: one world across a network stopped, requeued and exported
(gathered to node 0), node 0 lost on purpose, and nodes started with different settings refused (that nodes with
plain variables and other settings meet too, so are refused the same way, is test_entrypoint_rendezvous.py's: the
default id hashes no setting).

The cluster (tests/slurm_cluster.py) is made here: three network namespaces, slurmctld in one, a slurmd in each of
the others (`nq23n1` at 10.231.0.11, `nq23n2` at 10.231.0.12, each with its own host name and /etc/hosts), munged
with a socket of its own; all of it is stopped by pid and the namespaces deleted at the end. The jobs run this
checkout's launcher (`IMAGE=`) at smoke scale on CPU, one process per node, SHARED a temp folder both nodes see,
OMP_NUM_THREADS=1 everywhere so that one node with two processes computes exactly what two nodes with one do.
Skipped, with the reason, only where network namespaces cannot be made or Slurm cannot be installed. About 4-5
minutes on 2 cores, most of it the launches and, for the lost node, Slurm's SlurmdTimeout.
Run: .venv/bin/python -m pytest tests/test_slurm_nodes.py -q -s   (-s prints the measured figures)
"""

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import slurm_cluster
from conftest import ANSI, REPO, STEP_LOSS, folder_tensors
from slurm_cluster import alive, job_state

from neuron_qwen3.prelaunch import checkpoints

pytestmark = pytest.mark.training

STEPS, INTERVAL = 8, 2
PEER_TIMEOUT = 15  # the bound under test: a node whose node 0 is lost ends within it
SLURMD_TIMEOUT = 30  # above the bound: the survivor ends by itself before Slurm sets node 0 DOWN and requeues
SBATCH = str(REPO / "deploy" / "slurm" / "train.sbatch")
# warn: this host's nofile limit is below the production one. Export shards of 1 MB: the smoke model's 1.3 MB
# make two files and an index (train.sbatch exports to OUTPUT_DIR/hf).
RUN = {
    "VARIANT": "native",
    "SCALE": "smoke",
    "STEPS": str(STEPS),
    "CHECKPOINT_INTERVAL": str(INTERVAL),
    "OMP_NUM_THREADS": "1",
    "PREFLIGHT": "warn",
    "EXPORT_MAX_SHARD_MB": "1",
}
STOPPED = re.compile(r"stop: SIGTERM at step (\d+): ")
REFUSED = re.compile(
    r"config differs between ranks: (\S+) is (\S+) on rank 0 \((\S+)\) and (\S+) on rank 1 "
    r"\((\S+)\): start every node with the same settings"
)


def losses(text) -> dict:
    """{step: [loss as printed, by each node that printed it]}."""
    found = {}
    for step, loss in STEP_LOSS.findall(text):
        found.setdefault(int(step), []).append(loss)
    return found


def on_both_nodes(baseline, steps) -> dict:
    return {step: [baseline.losses[step]] * 2 for step in steps}


@dataclass
class OneNode:
    losses: dict  # {step: loss as printed}
    export: Path  # its EXPORT_DIR


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """(the cluster, the baseline's folder, its launcher): the baseline, one node with two processes, is launched
    before Slurm is installed and started, and trains while they wait on the network and the daemons."""
    why = slurm_cluster.namespaces_possible()
    if why:
        pytest.skip(f"no two-node cluster here: {why}")
    tmp = tmp_path_factory.mktemp("one-node")
    env = {name: value for name, value in os.environ.items() if not name.startswith(("SLURM_", "PET_"))}
    env.update(
        RUN,
        NPROC="2",
        OUTPUT_DIR=str(tmp / "out"),
        CHECKPOINT_DIR=str(tmp / "checkpoint"),
        CACHE_DIR=str(tmp / "cache"),
        EXPORT_DIR=str(tmp / "hf"),
    )
    with open(tmp / "launch.log", "w") as log:
        launcher = subprocess.Popen([sys.executable, "-m", "entrypoint"], cwd=REPO, env=env, stdout=log, stderr=log)
    try:
        why = slurm_cluster.install_slurm()
        if why:
            pytest.skip(f"no Slurm here: {why}")
        made = slurm_cluster.Cluster(tmp_path_factory.mktemp("nodes"))
        try:
            made.start(slurmd_timeout=SLURMD_TIMEOUT)
            yield made, tmp, launcher
        finally:
            made.stop()
    finally:
        launcher.terminate()  # the launcher forwards it to torchrun: nothing is left if a skip came first
        launcher.wait(timeout=120)


@pytest.fixture(scope="module")
def cluster(started):
    return started[0]


@pytest.fixture(scope="module")
def baseline(started) -> OneNode:
    """The global batch of two nodes with one process each, the same seed, on one node with two."""
    _, tmp, launcher = started
    status = launcher.wait(timeout=600)
    text = ANSI.sub("", (tmp / "launch.log").read_text())
    assert status == 0, text[-3000:]
    found = {step: values[0] for step, values in losses(text).items()}
    assert sorted(found) == list(range(1, STEPS + 1)), text[-3000:]
    return OneNode(found, tmp / "hf")


class Job:
    """One `sbatch --nodes=2 deploy/slurm/train.sbatch` of the checkout, its output appended across requeues."""

    def __init__(self, cluster, name, **env):
        self.cluster, self.out = cluster, cluster.tmp / f"{name}.out"
        env = {
            **cluster.env,
            **RUN,
            "IMAGE": "",
            "NEURON_QWEN3_HOME": str(REPO),
            "PYTHON": sys.executable,
            "SHARED": str(cluster.tmp / "shared"),
            "CACHE_DIR": str(cluster.tmp / "cache"),
            "NPROC": "1",
            "STOP_GRACE": "60",
            "PEER_TIMEOUT": str(PEER_TIMEOUT),
            **env,
        }
        cluster.wait_idle()
        submitted = cluster.slurm(
            "sbatch", "--parsable", "--nodes=2", "--open-mode=append", f"--output={self.out}", SBATCH, env=env
        )
        self.id = submitted.stdout.strip().split(";")[0]
        self.checkpoint = cluster.tmp / "shared" / "outputs" / f"qwen3-{self.id}" / "checkpoint"

    def text(self) -> str:
        return ANSI.sub("", self.out.read_text()) if self.out.exists() else ""

    def state(self) -> tuple:
        return job_state(self.cluster, self.id)

    def ended(self) -> bool:
        return self.state()[0] in ("COMPLETED", "FAILED", "CANCELLED", "GONE")  # a requeue is none of them

    def explain(self) -> str:
        shown = self.cluster.slurm("scontrol", "show", "job", self.id, check=False).stdout
        return f"\n--- job output (tail)\n{self.text()[-3000:]}\n--- scontrol show job\n{shown}{self.cluster.logs()}"

    def wait(self, predicate, what, timeout=600):
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}" + self.explain()
            time.sleep(0.3)

    def at_step(self, step) -> bool:
        return bool(re.search(rf"step:\s*{step}\s", self.text())) or self.ended()

    def end(self):
        """scancel, and nothing of it left on the nodes (a failed test must not disturb the next)."""
        self.cluster.slurm("scancel", self.id, check=False)
        self.wait(lambda: self.ended() or self.state()[0] == "PENDING", "the job to be cancelled", timeout=60)
        self.cluster.end_jobs()


def processes(cluster, node) -> dict:
    """{pid: command line} of the processes in the node's network namespace."""
    found = {}
    for pid in cluster.pids(node):
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                found[pid] = f.read().replace("\0", " ")
        except OSError:
            pass
    return found


def worker_ranks(cluster, job) -> dict:
    """{node: global rank of the worker running there}, read from the workers' RANK once both nodes have one."""
    ranks = {}

    def found():
        for node in slurm_cluster.NODES:
            for pid, command in processes(cluster, node).items():
                if "torchtitan.train" in command and "torch.distributed.run" not in command:
                    try:
                        environ = open(f"/proc/{pid}/environ").read().split("\0")
                    except OSError:
                        continue
                    ranks.update((node, int(v[5:])) for v in environ if v.startswith("RANK="))
        return len(ranks) == 2 or job.ended()

    job.wait(found, "a worker on each node")
    return ranks


def complete(folder, ranks=(0, 1)) -> bool:
    """A DCP checkpoint of every rank (one shard file each) whose .metadata is written and its byte ranges there."""
    broken = {name for name, _, _ in checkpoints.scan(folder.parent).broken}
    return (
        (folder / ".metadata").exists()
        and all((folder / f"__{rank}_0.distcp").exists() for rank in ranks)
        and folder.name not in broken
    )


def test_two_nodes_train_as_one_world_and_scancel_term_stops_both_at_one_step_and_the_requeue_resumes_there(
    cluster, baseline
):
    """One world of two ranks, one per node, with the losses of one node with two processes; `scancel
    --signal=TERM` stops both at one step with one checkpoint; the requeued job resumes there on both nodes and
    exports the model, node 1's shards gathered over the network to node 0, which writes (another node's disk need
    not be the folder node 0 renames into place): the same folder, tensor for tensor, as one node's."""
    job = Job(cluster, "stopped")
    try:
        ranks = worker_ranks(cluster, job)
        job.wait(lambda: job.at_step(2), "step 2")
        cluster.slurm("scancel", "--signal=TERM", job.id)
        job.wait(lambda: "requeueing job" in job.text() or job.ended(), "the stop and the requeue")
        first = job.text()
        stops = STOPPED.findall(first)
        assert len(stops) == 2 and stops[0] == stops[1], job.explain()  # each node's rank 0: the same step
        k = int(stops[0])
        assert 2 <= k < STEPS and first.count("exiting 143") == 2, job.explain()
        assert f"train.sbatch: stopped (143) with a checkpoint: requeueing job {job.id}" in first
        assert complete(job.checkpoint / f"step-{k}")  # one checkpoint of that step, shards from both nodes
        job.wait(job.ended, "the requeued job to finish")  # held until the old credential expires (11 s)
        assert job.state() == ("COMPLETED", 1), job.explain()
    finally:
        job.end()
    # both nodes' output, in chunks as srun received them: match within lines, not at starts
    launch = (
        f"torch.distributed.run --nproc_per_node=1 --nnodes=2 --rdzv_backend c10d --rdzv_endpoint nq23n1:29500 "
        f"--rdzv_id {job.id} --rdzv_conf is_host="
    )
    assert first.count(launch) == 2, job.explain()  # one launcher per node, meeting at the first node's address
    assert sorted(ranks.values()) == [0, 1], ranks  # one world of two ranks, one on each node
    assert first.count("dp_shard=2") == 2
    second = job.text()[len(first) :]
    assert second.count(f"Training starts at step {k + 1}") == 2, second[-3000:]
    assert losses(first) == on_both_nodes(baseline, range(1, k + 1))  # step for step, as printed
    assert losses(second) == on_both_nodes(baseline, range(k + 1, STEPS + 1))  # the uninterrupted run's losses
    assert complete(job.checkpoint / f"step-{STEPS}")  # both ranks' shards, one from each node
    exported = job.checkpoint.parent / "hf"
    assert second.count(f"2 files, 1 writing ranks) to {exported}") == 2, second[-3000:]  # said on both nodes
    ours, one_node = folder_tensors(exported), folder_tensors(baseline.export)
    assert len(ours) > 10 and ours.keys() == one_node.keys()
    assert all(torch.equal(ours[name], one_node[name]) for name in ours)
    assert (exported / "model.safetensors.index.json").read_text() == (
        baseline.export / "model.safetensors.index.json"
    ).read_text()
    print(
        f"\ntwo nodes: ranks {ranks}; stop: both nodes saved step {k}, exit 143, requeued, resumed at {k + 1} on "
        f"both, finished at {STEPS} with the losses of one node with two processes and its export"
    )


def test_a_node_started_with_another_setting_is_refused_in_one_line_naming_it(cluster):
    """The TaskProlog of the harness gives nq23n2 STEPS=9 in this job: within one Slurm job both nodes meet (the
    job id is the rendezvous id), and every rank names the setting instead of training two schedules."""
    job = Job(cluster, "mismatched", NQ23_NODE2_ENV=f"STEPS={STEPS + 1}")
    started = time.monotonic()
    try:
        job.wait(job.ended, "the refusal", timeout=300)
        took = time.monotonic() - started
        assert job.state() == ("FAILED", 0), job.explain()
    finally:
        job.end()
    text = job.text()
    refusals = {line.split(" - ERROR - ", 1)[-1] for line in text.splitlines() if "config differs" in line}
    assert len(refusals) == 1, job.explain()  # the same line on both nodes (and on torchrun's retry)
    name, value0, host0, value1, host1 = REFUSED.search(refusals.pop()).groups()
    assert name == "training.steps" and {(host0, value0), (host1, value1)} == {
        ("nq23n1", str(STEPS)),
        ("nq23n2", str(STEPS + 1)),
    }
    assert not losses(text) and "exitcode  : 2" in text  # the workers exit 2 before the first step
    print(f"\nmismatch under Slurm: refused in {took:.0f} s from submission: {name} {value0} vs {value1}")


def test_node_0_lost_ends_the_other_within_peer_timeout_and_the_requeued_job_resumes(cluster, baseline):
    """nq23n1 (node 0: the batch script, the rendezvous store) loses its cable, then SIGKILL takes its slurmd and
    every job process: no FIN, no RST, no save. The other node's launcher must end by itself within PEER_TIMEOUT
    (torchrun alone hung >384 s there); Slurm sets nq23n1 DOWN after SlurmdTimeout and requeues the job
    (`--requeue`); a broken newer checkpoint is planted, with the shard written on nq23n2 truncated; nq23n1 comes
    back and the job resumes on both nodes from the newest complete checkpoint."""
    job = Job(cluster, "lost")
    try:
        ranks = worker_ranks(cluster, job)
        job.wait(lambda: job.at_step(3), "step 3")
        launcher = next(
            pid for pid, command in processes(cluster, "nq23n2").items() if command.split()[1:3] == ["-m", "entrypoint"]
        )  # not the script's bash wrapper around it
        lost_at = time.monotonic()
        cluster.lose("nq23n1")
        while alive(launcher) and time.monotonic() - lost_at < PEER_TIMEOUT + 120:
            time.sleep(0.1)
        took = time.monotonic() - lost_at
        assert not alive(launcher), f"nq23n2's launcher still runs {took:.0f} s after node 0 was lost"
        # torchrun and the workers are Python processes; the script's bash wrapper, whose arguments name the
        # launcher's Python, may still be writing the launcher's status
        left_running = [
            command
            for command in processes(cluster, "nq23n2").values()
            if os.path.basename((command.split() or [""])[0]).startswith("python")
        ]
        assert not left_running, f"torchrun or a worker outlived the launcher on nq23n2: {left_running}"
        assert took <= PEER_TIMEOUT + 1, f"{took:.1f} s: more than PEER_TIMEOUT={PEER_TIMEOUT} s (+1)"
        before = job.text()
        job.wait(lambda: job.state() == ("PENDING", 1), "Slurm to requeue the job on nq23n1's failure", timeout=180)
        last = max(losses(before))
        left = checkpoints.scan(job.checkpoint)
        newest = left.latest
        assert newest is not None and last - newest <= INTERVAL, (last, newest)  # at most the interval lost
        planted = job.checkpoint / f"step-{max(int(p.name[5:]) for p in job.checkpoint.glob('step-*')) + 1}"
        shutil.copytree(job.checkpoint / f"step-{newest}", planted)  # all files there, one shard cut short:
        shard = planted / f"__{ranks['nq23n2']}_0.distcp"  # the one written on the node that survived
        os.truncate(shard, shard.stat().st_size // 2)
        cluster.revive("nq23n1")
        job.wait(job.ended, "the requeued job to finish")
        assert job.state() == ("COMPLETED", 1), job.explain()
    finally:
        job.end()
        if "nq23n1" not in cluster.daemons:
            cluster.revive("nq23n1")
    second = job.text()[len(before) :]
    broken = re.findall(
        rf"entrypoint: warning: checkpoint {re.escape(str(planted))} is broken "
        rf"\({shard.name} has \d+ bytes, \.metadata needs \d+\): (moved to \S+|skipped)",
        second,
    )
    # moved by node 0 only; node 1 reports it `skipped` when it looks before node 0 has moved it
    assert sorted(broken) in (
        [f"moved to {job.checkpoint}/incomplete"],
        [f"moved to {job.checkpoint}/incomplete", "skipped"],
    ), second[-3000:]
    assert f"entrypoint: checkpoints: resuming from step {newest} in {job.checkpoint}" in second
    assert second.count(f"Loading the checkpoint from {job.checkpoint}/step-{newest}.") == 2  # both nodes
    assert losses(second) == on_both_nodes(baseline, range(newest + 1, STEPS + 1))
    print(
        f"\nnode 0 lost at step {last}: nq23n2's launcher ended {took:.1f} s later (PEER_TIMEOUT={PEER_TIMEOUT}); "
        f"requeued; {planted.name} (a truncated shard of rank {ranks['nq23n2']}) moved aside; resumed from "
        f"step-{newest} on both nodes; losses equal to the uninterrupted run's"
    )
