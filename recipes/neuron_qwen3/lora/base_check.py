"""LoRA checkpoints hold the adapters, not the base they were trained over; the base is loaded from INIT_FROM at
every start. A resume refuses a base whose fingerprint differs from the one saved: the adapters only mean
something over the base they were trained on.
"""

import hashlib
import os

from torch.distributed.checkpoint.stateful import Stateful

from neuron_qwen3.lora.targets import LoRAError

BASE_STATE = "lora_base"  # the checkpoint entry holding the base's fingerprint
SAMPLE = 1 << 20  # bytes read at each end of each weight file for the base's fingerprint


def base_fingerprint(folder: str) -> dict:
    """{"bytes": total size of the weight files, "sha256": of the index file and, per weight file, its name, size
    and first and last SAMPLE bytes}. The samples tell apart two bases of one shape (Qwen3-4B and Qwen3-4B-Base have
    the same index and sizes); the whole content is not hashed (64 GB at 32B would take minutes every start)."""
    digest = hashlib.sha256()
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, "rb") as f:
            digest.update(f.read())
    total = 0
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".safetensors")):
        path = os.path.join(folder, name)
        size = os.path.getsize(path)
        digest.update(f"{name}\0{size}\n".encode())
        with open(path, "rb") as f:
            digest.update(f.read(SAMPLE))
            f.seek(max(0, size - SAMPLE))
            digest.update(f.read(SAMPLE))
        total += size
    return {"bytes": total, "sha256": digest.hexdigest()}


def _differs(saved: dict, base: dict, folder: str) -> str | None:
    if saved == base:
        return None
    return (
        f"the checkpoint's adapters were trained over a base of {saved['bytes']:,} bytes (sha256 "
        f"{saved['sha256'][:12]}), but INIT_FROM {folder} has {base['bytes']:,} bytes (sha256 "
        f"{base['sha256'][:12]}): resume over the same base, or use a fresh CHECKPOINT_DIR"
    )


class BaseCheck(Stateful):
    """Saved with every checkpoint; on a resume, raises LoRAError unless the base loaded now is the saved one."""

    def __init__(self, folder: str):
        self.folder, self.fingerprint = folder, base_fingerprint(folder)

    def state_dict(self) -> dict:
        return dict(self.fingerprint)

    def load_state_dict(self, state_dict: dict) -> None:
        problem = _differs(dict(state_dict), self.fingerprint, self.folder)
        if problem:
            raise LoRAError(problem)


def check_resume_base(step_dir: str, base_folder: str) -> list[str]:
    """For the pre-launch pass: the problem (one line) of resuming the LoRA checkpoint `step_dir` over
    `base_folder`; [] when it is the base the checkpoint was trained over, or not a LoRA checkpoint."""
    import torch.distributed.checkpoint as dcp

    reader = dcp.FileSystemReader(step_dir)
    if not any(key.startswith(f"{BASE_STATE}.") for key in reader.read_metadata().state_dict_metadata):
        return []
    saved = {BASE_STATE: {"bytes": 0, "sha256": ""}}
    dcp.load(saved, storage_reader=reader, no_dist=True)
    problem = _differs(saved[BASE_STATE], base_fingerprint(base_folder), base_folder)
    return [f"CHECKPOINT_DIR {step_dir}: {problem}"] if problem else []
