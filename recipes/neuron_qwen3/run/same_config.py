"""Every rank trains one config or none does: the ranks compare their parsed configs before anything is built.

Each node parses its own flags from its own environment, so a node started with another STEPS, VARIANT or
EXTRA_ARGS, or from an image of another version, still joins the others (the rendezvous id is the job's, or a hash
of the node count and endpoint) and would train another model or schedule, or wait in a collective whose shapes
differ. So right after the process group starts, the ranks all-gather a digest of their config on a gloo group
(once, a few bytes). If one differs, they gather the configs, every rank logs the same line naming the first field
that differs, with rank 0's value and that rank's, and exits 2. Fields naming this node's own files (its logs, its
copy of the assets, the data and the initial weights) and its launch time may differ.
"""

import hashlib
import json
import re
import socket
from datetime import timedelta

import torch.distributed as dist
from torchtitan.tools.logging import logger

NODE_LOCAL = (
    "dump_folder",
    "hf_assets_path",
    "dataloader.source",
    "checkpoint.initial_load_path",
    "report.launched_at",
)
ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # `<function normal_ at 0x7f...>`: differs between processes


def fields(config: dict) -> dict:
    """{dotted name: value as text} of a `Config.to_dict()`, list items by index (`...layers[0].n_heads`)."""
    flat = {}

    def walk(value, name):
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(item, f"{name}.{key}" if name else key)
        elif isinstance(value, (list, tuple)) and value:
            for i, item in enumerate(value):
                walk(item, f"{name}[{i}]")
        elif name not in NODE_LOCAL:
            flat[name] = ADDRESS.sub("", repr(value))

    walk(config, "")
    return flat


def first_difference(a: dict, b: dict) -> str | None:
    """The first field, in `a`'s order, whose value differs in `b` (or that only one of them has)."""
    return next((name for name in [*a, *(n for n in b if n not in a)] if a.get(name) != b.get(name)), None)


def check_same_config(config) -> None:
    """Collective: returns when every rank parsed the same config; otherwise logs one line and exits 2 everywhere."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    mine = fields(config.to_dict())
    digest = hashlib.sha256(json.dumps(mine, sort_keys=True).encode()).hexdigest()
    digests = [None] * dist.get_world_size()
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=config.comm.init_timeout_seconds))
    try:
        dist.all_gather_object(digests, digest, group=group)
        if len(set(digests)) == 1:
            return
        everyone = [None] * len(digests)
        dist.all_gather_object(everyone, (socket.gethostname(), mine), group=group)
    finally:
        dist.destroy_process_group(group)
    rank = next(r for r, digest in enumerate(digests) if digest != digests[0])
    (host0, first), (host, other) = everyone[0], everyone[rank]
    name = first_difference(first, other)
    logger.error(
        f"config differs between ranks: {name} is {first.get(name, 'unset')} on rank 0 ({host0}) and "
        f"{other.get(name, 'unset')} on rank {rank} ({host}): start every node with the same settings"
    )
    raise SystemExit(2)
