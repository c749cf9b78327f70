"""The Neuron SDK's Python packages, imported only where an NKI kernel is about to run.

The two kernel seams (moe/nki_kernels.py, attention/nki_kernels.py) import torch_neuronx and nki through `Seam`, and
nkilib's kernels themselves; off Trainium each import fails with one ImportError naming the package, where it comes
from, and the switch that runs the PyTorch reference instead. Importing this module touches none of them.
"""

from dataclasses import dataclass
from typing import Literal

INDEX = "https://pip.repos.neuron.amazonaws.com"
KERNELS = ("auto", "nki", "reference")  # --neuron.moe_kernel and --neuron.attention_kernel (settings.Neuron)


def kernel_path(kernel: str, device_type: str) -> Literal["nki", "reference"]:
    """Which implementation a kernel seam runs for tensors on `device_type`: `kernel`, where auto is NKI on Neuron."""
    assert kernel in KERNELS, f"kernel {kernel!r} is not one of {', '.join(KERNELS)}"
    if kernel == "auto":
        return "nki" if device_type == "neuron" else "reference"
    return kernel


@dataclass(frozen=True)
class Seam:
    path: str  # "nki_moe kernel path"
    reference: str  # what runs the reference off Trainium: "the experts run"
    switch: str  # the variable that picks it: "NEURON_QWEN3_MOE_KERNEL"

    def missing(self, package: str, pip_name: str, error: ImportError) -> ImportError:
        return ImportError(
            f"{self.path}: the Neuron package '{package}' is not importable ({error}). "
            f"It comes with the Neuron SDK ({pip_name} from {INDEX}) and runs only on Trainium. Off Trainium "
            f"{self.reference} the PyTorch reference: leave {self.switch} unset (or set it to 'reference')."
        )

    def torch_neuronx_and_nki(self):
        """(nki_op, wrap_nki, the nki module): TorchNeuron's registration of NKI kernels as torch ops, and NKI."""
        try:
            from torch_neuronx import nki_op, wrap_nki
        except ImportError as e:
            raise self.missing("torch_neuronx", "torch-neuronx", e) from e
        try:
            import nki
        except ImportError as e:
            raise self.missing("nki", "nki", e) from e
        return nki_op, wrap_nki, nki
