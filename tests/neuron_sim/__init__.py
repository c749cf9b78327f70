"""A simulated `neuron` device for the tests (never in the image, never on the run path).

On a trn2, TorchNeuron registers `neuron` as PyTorch's PrivateUse1 device, with a device module `torch.neuron`
and a c10d backend `neuron`; torch.compile there goes through its own backend, never Inductor. `install()` gives a
process the same shape on a host without Trainium: a C++ extension (built once, `build.py`) that keeps the
device's tensors in host memory and runs every operator through ATen's CPU fallback, `torch.neuron`
(`device_module.py`), the `neuron` process group over gloo (`process_group.py`) and the recorders
(`recorder.py`).

Workers (torchrun's children) load it before anything imports torchtitan through `site/sitecustomize.py`: put
tests/neuron_sim/site on PYTHONPATH and set NEURON_SIM=1. NEURON_SIM_DEVICES sets the device count (8),
NEURON_SIM_REPORT a folder that receives each process's record at exit, NEURON_SIM_LOGPROB_OFFSET a number added to
every log-probability the generator reports: on a trn2 the generator's float32 attention and MoE decode are not the
learner's bf16 NKI kernels, so its log-probabilities are off, and GRPO's loss must not see it (pi_old is the
learner's).
"""

import atexit
import os

from . import build, device_module, process_group, recorder
from .recorder import OpRecorder, census, dump, reset

__all__ = ["OpRecorder", "census", "dump", "install", "installed", "reset"]

_ext = None


def installed() -> bool:
    return _ext is not None


def install(devices: int | None = None):
    """Make `neuron` a device of this process; returns the extension module. Idempotent."""
    global _ext
    if _ext is not None:
        return _ext
    import torch

    ext = build.load()
    ext.set_device_count(devices or int(os.environ.get("NEURON_SIM_DEVICES", "8")))
    ext.register_hooks()
    device_module._ext = recorder._ext = ext
    torch.utils.rename_privateuse1_backend("neuron")
    torch._register_device_module("neuron", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
    process_group.register()
    _ext = ext
    folder = os.environ.get("NEURON_SIM_REPORT")
    if folder:
        atexit.register(recorder.dump_at_exit, folder)
    if os.environ.get("NEURON_SIM_LOGPROB_OFFSET"):
        _offset_generator_logprobs(float(os.environ["NEURON_SIM_LOGPROB_OFFSET"]))
    return ext


def _offset_generator_logprobs(offset: float) -> None:
    """The generator's `draw` (before generate/engine.py imports it) with `offset` added to each log-probability it
    reports; the tokens it draws are unchanged."""
    from neuron_qwen3.generate import sampling

    draw = sampling.draw

    def offset_draw(logits, settings, generator):
        tokens, logprobs = draw(logits, settings, generator)
        return tokens, logprobs + offset

    sampling.draw = offset_draw
