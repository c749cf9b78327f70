"""Names and defaults that the launcher and the workers both read (stdlib only, so the recipes may import it).

One home for each: contract.py builds the environment table from these, the recipes' MoE experts read the kernel
choice with the same parser, and the kernels take the same LNC default as the launcher gives the runtime.
"""

LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
LNC_CHOICES = ("1", "2")
LNC_DEFAULT = "2"  # trn2's default: 2 physical NeuronCores per logical core

MOE_KERNEL_ENV = "NEURON_QWEN3_MOE_KERNEL"
MOE_KERNELS = ("auto", "nki", "reference")
MOE_KERNEL_DEFAULT = "auto"


def moe_kernel(raw: str) -> str:
    """NEURON_QWEN3_MOE_KERNEL's value, exactly one of MOE_KERNELS; ValueError otherwise (no case folding)."""
    if raw not in MOE_KERNELS:
        raise ValueError(f"{MOE_KERNEL_ENV}={raw!r} is not one of: {', '.join(MOE_KERNELS)}")
    return raw

LOSS_LINE = r"step:\s*(\d+)\s+loss:\s*(\S+)"  # torchtitan's metrics line, as the launcher's children print it
COLOUR = r"\x1b\[[0-9;]*m"  # the terminal colour codes torchtitan puts in that line: strip them before matching
