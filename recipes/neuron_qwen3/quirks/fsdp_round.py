"""A generation round with every FSDP unit's weights gathered once, at its first forward pass, and freed at the end.

torchtitan shards each block to free its gathered weights after each forward pass (reshard after forward), right
for training, where the backward gathers them again. A generator runs a forward pass per new token, so that way it
all-gathers every block at every decode step. FSDP2's public switch, `set_reshard_after_forward`, has no getter
and cannot put torchtitan's choice back after the round: it sets one value for every unit and clears the flag that
exempts the root (torch/distributed/fsdp/_fully_shard/_fully_shard.py). So the round saves and restores what the
switch writes, each parameter group's `post_forward_mesh_info` (None: keep the weights after forward), and the
root's state is initialised first, as its first forward pass would, so that what is saved is what training uses.
"""

import contextlib


@contextlib.contextmanager
def gathered(model):
    """Inside the block, each FSDP unit of `model` keeps the weights its first forward pass gathers; after it, each
    unit frees them and reshards after forward exactly as before. A model without FSDP is left as it is."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        yield
        return
    if isinstance(model, FSDPModule):
        model._get_fsdp_state()._lazy_init()  # the root's exemption, set at its first forward pass
    groups = [group for unit in units for group in unit._get_fsdp_state()._fsdp_param_groups]
    saved = [group.post_forward_mesh_info for group in groups]
    for group in groups:
        group.post_forward_mesh_info = None
    try:
        yield
    finally:
        for group, info in zip(groups, saved):
            group.post_forward_mesh_info = info
        for unit in units:
            unit.reshard()
