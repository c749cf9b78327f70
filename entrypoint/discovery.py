"""What accelerator this container sees and how many processes it can feed: Neuron, then CUDA, then CPU.

One function per device kind, reading under a filesystem `root` (tests pass a fake /dev); device nodes and
`neuron-ls` are enough to count, no device runtime is imported.
"""

import glob
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from entrypoint.contract import Settings, UsageError

PHYSICAL_CORES_PER_DEVICE = 8  # trn2: 8 NeuronCore-v3 per Trainium2 device


@dataclass(frozen=True)
class Devices:
    kind: str  # neuron | cuda | cpu
    count: int  # processes' worth: usable logical NeuronCores, GPUs, or CPU cores
    nodes: tuple = ()  # device node names, e.g. ("neuron0", "neuron1")
    lnc: int | None = None  # logical NeuronCore config
    visible_cores: tuple | None = None  # NEURON_RT_VISIBLE_CORES, expanded
    held: tuple = ()  # (device node, pid, command) of each process neuron-ls shows on a device


def _numbered(root, prefix):
    """The N of every <root>/dev/<prefix>N, sorted; any file counts, device node or not."""
    names = map(os.path.basename, glob.glob(os.path.join(glob.escape(root), "dev", f"{prefix}*")))
    return sorted(int(m[1]) for m in (re.fullmatch(rf"{prefix}(\d+)", name) for name in names) if m)


def run_neuron_ls():
    """The devices `neuron-ls -j` lists (number, LNC-adjusted core count, the processes using it), or None if
    it is absent or fails. A process entry is read as {"pid": N, "command": "..."}; other keys are ignored."""
    exe = shutil.which("neuron-ls")
    if not exe:
        return None
    try:
        listing = json.loads(subprocess.run([exe, "-j"], capture_output=True, check=True, timeout=60).stdout)
        return [
            {
                "neuron_device": int(d["neuron_device"]),
                "nc_count": int(d["nc_count"]),
                "processes": [
                    (int(p.get("pid", -1)), str(p.get("command", "?"))) for p in d.get("neuron_processes") or ()
                ],
            }
            for d in listing
        ]
    except (OSError, subprocess.SubprocessError, ValueError, TypeError, KeyError, AttributeError):
        return None


def neuron(root="/", lnc=2, visible=None, listing=None):
    """Logical NeuronCores from a neuron-ls listing (nc_count is LNC-adjusted), else /dev/neuronN x (8 // LNC)."""
    held = ()
    if listing:
        nodes = tuple(f"neuron{device['neuron_device']}" for device in listing)
        total = sum(device["nc_count"] for device in listing)
        held = tuple(
            (f"neuron{device['neuron_device']}", pid, command)
            for device in listing
            for pid, command in device.get("processes", ())
        )
    else:
        numbers = _numbered(root, "neuron")
        if not numbers:
            return None
        if numbers != list(range(len(numbers))):
            gap = min(set(range(numbers[-1])) - set(numbers))
            raise UsageError(
                f"/dev/neuron{gap} is missing but /dev/neuron{numbers[-1]} exists: Neuron devices must "
                f"be contiguous from neuron0 (found {', '.join(f'neuron{n}' for n in numbers)})"
            )
        nodes = tuple(f"neuron{n}" for n in numbers)
        total = len(nodes) * (PHYSICAL_CORES_PER_DEVICE // lnc)
    if visible is not None:
        missing = [core for core in visible if core >= total]
        if missing:
            raise UsageError(
                f"NEURON_RT_VISIBLE_CORES names core {missing[0]}, but the {len(nodes)} Neuron devices "
                f"have logical cores 0-{total - 1} (NEURON_LOGICAL_NC_CONFIG={lnc})"
            )
    return Devices("neuron", len(visible) if visible else total, nodes, lnc, visible, held)


def cuda(root="/", visible=None):
    """GPUs from /dev/nvidiaN; CUDA_VISIBLE_DEVICES keeps, as CUDA does, the entries before the first invalid one."""
    nodes = tuple(f"nvidia{n}" for n in _numbered(root, "nvidia"))
    count = len(nodes)
    if visible is not None:
        valid = [
            entry.startswith(("GPU-", "MIG-")) or (entry.isdigit() and int(entry) < len(nodes)) for entry in visible
        ]
        count = (valid + [False]).index(False)
    return Devices("cuda", count, nodes) if count else None


def cpu():
    return Devices("cpu", os.cpu_count() or 1)


def discover(settings: Settings, root="/", neuron_ls=run_neuron_ls) -> Devices:
    """DEVICE=auto: Neuron, else CUDA, else CPU. neuron-ls describes only the real machine, so it is consulted
    only when discovery looks at "/"."""
    if settings.device == "cpu":
        return cpu()
    found = None
    if settings.device in ("auto", "neuron"):
        listing = neuron_ls() if root == "/" else None
        found = neuron(root, settings.neuron_logical_nc_config, settings.neuron_rt_visible_cores, listing)
    if not found and settings.device in ("auto", "cuda"):
        found = cuda(root, settings.cuda_visible_devices)
    if not found and settings.device != "auto":
        raise UsageError(
            f"DEVICE={settings.device} but no {settings.device} device is visible here "
            "(allowed: auto, neuron, cuda, cpu)"
        )
    return found or cpu()
