"""Destroy the process groups at interpreter exit, whatever ended the run.

Stock `torchtitan.train` destroys them after a normal finish only. A stop (exit 143), a diverged loss (3), a bad
record (2) or an exception leave them to interpreter finalization, where gloo's worker threads are torn down with
the interpreter: now and then the process then aborts ("terminate called without an active exception", SIGABRT)
and torchrun reports a failed run (pytorch/pytorch#190489; the atexit fix upstream, pytorch/pytorch#179291, was
abandoned). The save-on-stop group is gloo on every device. An atexit handler runs while the interpreter is whole.
Destroying the groups is not all: the trainer (its model's FSDP states and device mesh, which hold them) sits in
reference cycles that only the collector frees, which without the handler happens during finalization too, after
a normal finish as well; the handler collects it first.
"""

import atexit
import gc

import torch.distributed as dist


def destroy_process_groups() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def at_exit() -> None:
    """Once the process group exists; atexit runs last-registered first, so before torch's own exit handlers."""
    atexit.unregister(destroy_process_groups)  # one registration, however often a process builds a trainer
    atexit.register(destroy_process_groups)
