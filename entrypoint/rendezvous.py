"""How many nodes, which one this is, and where they meet: each field from the plain variable, else Kubeflow's
PET_*, else Slurm's. What each choice avoids (the loopback endpoint on one node, the rendezvous id, node 0 hosting
the store): docs/production.md, "How the rendezvous is built".
"""

import hashlib
from dataclasses import dataclass

from entrypoint.contract import Settings, UsageError

DEFAULT_PORT = 29500
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Rendezvous:
    nnodes: int
    node_rank: int
    endpoint: str  # host:port; `127.0.0.1:0` on one node (torchrun picks a free port)
    run_id: str | None  # None on one node
    sources: dict  # field -> the variable it came from, for the plan and the error lines
    nproc_per_node: int | None  # PET_NPROC_PER_NODE; `auto` and unset are None
    local_addr: str | None = None  # this node's address for its peers; 127.0.0.1 on one node
    timeout: int = 600  # RDZV_TIMEOUT

    def torchrun_args(self) -> list:
        local = ["--local-addr", self.local_addr] if self.local_addr else []
        if self.nnodes == 1:
            return ["--rdzv_backend", "c10d", "--rdzv_endpoint", self.endpoint, *local]
        # c10d ignores --node_rank: node 0 hosts the store, where torch's guess compares MASTER_ADDR with this host
        conf = f"is_host={str(self.node_rank == 0).lower()},join_timeout={self.timeout},read_timeout={self.timeout}"
        return [
            f"--nnodes={self.nnodes}",
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            self.endpoint,
            "--rdzv_id",
            self.run_id,
            "--rdzv_conf",
            conf,
            *local,
        ]


def _first(*candidates):
    """(value, name) of the first candidate whose value is set, else (None, None)."""
    return next(((value, name) for name, value in candidates if value is not None), (None, None))


def resolve(settings: Settings) -> Rendezvous:
    s = settings
    first_host = s.slurm_job_nodelist[0] if s.slurm_job_nodelist else None
    nnodes, nnodes_from = _first(("NNODES", s.nnodes), ("PET_NNODES", s.pet_nnodes), ("SLURM_NNODES", s.slurm_nnodes))
    rank, rank_from = _first(
        ("NODE_RANK", s.node_rank), ("PET_NODE_RANK", s.pet_node_rank), ("SLURM_NODEID", s.slurm_nodeid)
    )
    nproc = s.pet_nproc_per_node
    if nnodes in (None, 1):
        if rank not in (None, 0):
            raise UsageError(f"{rank_from}={rank} but the job has one node: node ranks start at 0")
        # loopback: torchrun would name the store by a host name, which `docker run --network none` cannot resolve
        return Rendezvous(1, 0, f"{LOOPBACK}:0", None, {"nnodes": nnodes_from or "default"}, nproc, LOOPBACK)
    if rank is None:
        raise UsageError(f"{nnodes_from}={nnodes} but this node's rank is unset: set NODE_RANK (0-{nnodes - 1})")
    if rank >= nnodes:
        raise UsageError(
            f"{rank_from}={rank} is not a node rank of a {nnodes}-node job ({nnodes_from}): allowed 0-{nnodes - 1}"
        )
    if nnodes_from == "SLURM_NNODES" and s.slurm_job_nodelist and len(s.slurm_job_nodelist) != nnodes:
        raise UsageError(f"SLURM_NNODES={nnodes} but SLURM_JOB_NODELIST names {len(s.slurm_job_nodelist)} hosts")
    addr, addr_from = _first(
        ("MASTER_ADDR", s.master_addr), ("PET_MASTER_ADDR", s.pet_master_addr), ("SLURM_JOB_NODELIST", first_host)
    )
    if addr is None:
        raise UsageError(f"{nnodes_from}={nnodes} but no rendezvous host: set MASTER_ADDR to node 0's address")
    port, port_from = _first(
        ("MASTER_PORT", s.master_port), ("PET_MASTER_PORT", s.pet_master_port), ("default", DEFAULT_PORT)
    )
    host = f"[{addr}]" if ":" in addr else addr  # an IPv6 address
    shared = "neuron-qwen3-" + hashlib.sha256(f"{nnodes} {host}:{port}".encode()).hexdigest()[:12]
    run_id, id_from = _first(
        ("RDZV_ID", s.rdzv_id), ("SLURM_JOB_ID", s.slurm_job_id), ("the node count and endpoint", shared)
    )
    sources = {
        "nnodes": nnodes_from,
        "node_rank": rank_from,
        "master_addr": addr_from,
        "master_port": port_from,
        "run_id": id_from,
    }
    return Rendezvous(nnodes, rank, f"{host}:{port}", run_id, sources, nproc, s.local_addr, s.rdzv_timeout)
