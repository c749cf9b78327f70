"""`python -m neuron_qwen3.selftest runtime | kernels LNC`: the checks of `--self-test` that need torch.

The launcher's `--self-test` runs them in children (the kernels once per LNC, with the runtime's
NEURON_LOGICAL_NC_CONFIG set for the child) and prints their lines as its verdicts: `PASS name: detail` for each
check, `FAIL name: reason` at the first failure (exit 1). Nothing here runs at import: torch is imported by the
checks that need it.
"""

import sys
from dataclasses import dataclass

from neuron_qwen3 import shapes


@dataclass(frozen=True)
class Shape:
    name: str
    dim: int  # H
    hidden: int  # I
    experts: int
    tokens: int
    top_k: int
    block_size: int


# The smoke MoE model's layer, and Qwen3-30B-A3B's H and I with fewer experts (the CPU reference stays quick).
SHAPES = (Shape("smoke", shapes.SMOKE_MOE.dim, shapes.SMOKE_MOE.hidden_dim, shapes.SMOKE_MOE.num_experts, 256,
                shapes.SMOKE_MOE.top_k, 256),
          Shape("30b_a3b", shapes.FLAVORS["30B-A3B"].dim, shapes.FLAVORS["30B-A3B"].hidden_dim, 8, 512,
                shapes.FLAVORS["30B-A3B"].top_k, 256))


class Failed(Exception):
    """A check's verdict: failed, with the reason in one line."""


def check_runtime() -> str:
    import importlib.metadata

    try:
        import torch_neuronx  # noqa: F401  before anything else picks a device
    except ImportError as error:
        raise Failed(f"torch_neuronx is not importable ({error})") from error
    import torch

    doubled = (torch.ones(4, device="neuron") * 2).cpu()
    if not torch.equal(doubled, torch.full((4,), 2.0)):
        raise Failed(f"a tensor did not round-trip through a NeuronCore: {doubled.tolist()}")
    return f"torch {torch.__version__}, torch-neuronx {importlib.metadata.version('torch-neuronx')}"


def relative_error(actual, expected) -> float:
    """max |actual - expected| / max |expected|, the measure of the CPU tests (their scale_close)."""
    actual, expected = actual.detach().float().cpu(), expected.detach().float()
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30))


def compare_kernels(shape: Shape, device: str, lnc: int = 2, seed: int = 0) -> str:
    """The op on `device` (the NKI kernels on Neuron) against reference_forward/backward on CPU, in bf16."""
    import torch

    from neuron_qwen3.moe.experts import blockwise_moe_experts
    from neuron_qwen3.moe.layout import (BlockLayout, ExpertWeights, max_num_blocks, presorted_block_layout,
                                         unit_affinities)
    from neuron_qwen3.moe.reference import TOLERANCE, reference_backward, reference_forward

    gen = torch.Generator().manual_seed(seed)
    rows = shape.tokens * shape.top_k
    counts = torch.bincount(torch.randint(0, shape.experts, (rows,), generator=gen), minlength=shape.experts)
    layout = presorted_block_layout(counts, rows, shape.block_size, max_num_blocks(rows, shape.experts,
                                                                                   shape.block_size))
    dtype = torch.bfloat16
    x = torch.cat([torch.randn(rows, shape.dim, generator=gen), torch.zeros(1, shape.dim)]).to(dtype)
    weights = ExpertWeights(*(torch.randn(shape.experts, *dims, generator=gen).div(dims[1] ** 0.5).to(dtype)
                              for dims in ((shape.hidden, shape.dim), (shape.hidden, shape.dim),
                                           (shape.dim, shape.hidden))))
    affinities = unit_affinities(layout, shape.experts, dtype)
    grad_out = torch.randn(rows, shape.dim, generator=gen).to(dtype)

    ref_out, *checkpoints = reference_forward(x, affinities, weights, layout)
    ref_grads = reference_backward(grad_out, x, affinities, weights, tuple(checkpoints), layout)

    to = lambda t: t.detach().to(device).requires_grad_(t.is_floating_point())  # noqa: E731
    dev_x, dev_w = to(x), [to(w) for w in (weights.w1_EFD, weights.w3_EFD, weights.w2_EDF)]
    dev_layout = BlockLayout(layout.token_position_to_id.to(device), layout.block_to_expert.to(device),
                             layout.num_tokens, layout.block_size)
    out = blockwise_moe_experts(dev_x, affinities.to(device), ExpertWeights(*dev_w), dev_layout, "nki", lnc)
    out.backward(grad_out.to(device))

    tolerance = TOLERANCE["bfloat16"]
    out_err = relative_error(out, ref_out)
    # The padding row's input gradient is not compared: NKIGroupedExperts drops it (it is its own zero row).
    grad_err = max(relative_error(got, want) for got, want in zip([dev_x.grad[:rows], *(w.grad for w in dev_w)],
                                                                  [ref_grads[0][:rows], *ref_grads[2:]]))
    verdict = (f"H={shape.dim} I={shape.hidden} E={shape.experts} B={shape.block_size}: output error "
               f"{out_err:.1e} (tolerance {tolerance['output']:g}), gradients {grad_err:.1e} "
               f"(tolerance {tolerance['gradients']:g})")
    if not (out_err <= tolerance["output"] and grad_err <= tolerance["gradients"]):
        raise Failed(verdict)
    return verdict


def checks(argv) -> list:
    """The (name, check) pairs of `runtime` or `kernels LNC`."""
    if argv == ["runtime"]:
        return [("runtime", check_runtime)]
    if len(argv) == 2 and argv[0] == "kernels" and argv[1] in ("1", "2"):
        import torch_neuronx  # noqa: F401  the neuron device, before the kernels' tensors need it

        return [(f"nki_moe LNC {argv[1]} {shape.name}", lambda s=shape: compare_kernels(s, "neuron", int(argv[1])))
                for shape in SHAPES]
    raise SystemExit("usage: python -m neuron_qwen3.selftest runtime | kernels 1|2")


def main(argv=None) -> int:
    """Each check's verdict line; stop at the first failure (exit 1)."""
    for name, check in checks(sys.argv[1:] if argv is None else argv):
        try:
            detail = check()
        except Exception as error:  # a check's own bug is a failure too, in one line
            print(f"FAIL {name}: {str(error).splitlines()[0] if str(error) else type(error).__name__}", flush=True)
            return 1
        print(f"PASS {name}: {detail}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
