"""`--self-test` on a trn2: one verdict line per check, after the launcher's own line for the devices it found.

    runtime      torch_neuronx imports and a tensor round-trips through a NeuronCore
    nki_moe      the NKI MoE forward and backward, and a decode step's rows through the token-generation kernel,
                 against the PyTorch reference on shapes the kernels take, at LNC 2 and LNC 1 (a process each: the
                 runtime reads the LNC once), every error printed against the bf16 tolerance the CPU tests hold the
                 reference to
    attention    nkilib's attention forward and backward (attention/nki_kernels.py) against the PyTorch reference
                 on packed windows of several documents, the smoke model's heads and Qwen3-4B's, at LNC 2 and
                 LNC 1 (a process each), every error printed against ATTENTION_TOLERANCE
    native       three native smoke steps on one NeuronCore, through the article's command typed as by hand

The launcher runs `python -m neuron_qwen3.prelaunch.selftest` when it found Neuron devices; the first failure stops
the run with exit status 1, all passed is 0. Nothing runs at import: torch is imported by the checks that need it.
"""

import math
import re
import subprocess
import sys
from dataclasses import dataclass

from neuron_qwen3 import shapes

LNC_ORDER = (2, 1)  # trn2's default first
PREFIX = "self-test: "  # every verdict line, the launcher's devices line too
LOSS_LINE = r"step:\s*(\d+)\s+loss:\s*(\S+)"  # torchtitan's metrics line, as the workers print it
COLOUR = r"\x1b\[[0-9;]*m"  # the terminal colour codes torchtitan puts in that line: strip them before matching


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
SHAPES = (
    Shape(
        "smoke",
        shapes.SMOKE_MOE.dim,
        shapes.SMOKE_MOE.hidden_dim,
        shapes.SMOKE_MOE.num_experts,
        256,
        shapes.SMOKE_MOE.top_k,
        256,
    ),
    Shape(
        "30b_a3b",
        shapes.FLAVORS["30B-A3B"].dim,
        shapes.FLAVORS["30B-A3B"].hidden_dim,
        8,
        512,
        shapes.FLAVORS["30B-A3B"].top_k,
        256,
    ),
)
DECODE_SLOTS = 8  # a generator's decode step: one token per slot, each routed to top_k experts


@dataclass(frozen=True)
class AttentionShape:
    name: str
    heads: int  # Hq
    kv_heads: int  # Hkv
    head_dim: int  # D
    documents: tuple[tuple[int, ...], ...]  # each batch row's document lengths, one packed window per row


# The smoke model's heads in its 256-token window (the smoke configs' seq_len), two rows; Qwen3-4B's in a 4096-token
# window, one row. Several documents per window, of lengths no multiple of 128.
ATTENTION_SHAPES = (
    AttentionShape(
        "smoke", shapes.SMOKE.n_heads, shapes.SMOKE.n_kv_heads, shapes.SMOKE.head_dim, ((100, 37, 119), (256,))
    ),
    AttentionShape(
        "4b",
        shapes.FLAVORS["4B"].n_heads,
        shapes.FLAVORS["4B"].n_kv_heads,
        shapes.FLAVORS["4B"].head_dim,
        ((1000, 37, 2048, 1011),),
    ),
)
# bf16 against the reference's fp32 maths, as max |error| / max |expected| (lse: max |error|, it is a log). A CPU
# emulation of the kernels' bf16 roundings (q * scale, the probabilities and dS rounded to bf16) measured on these
# shapes: output 4.7e-3, lse 5.7e-3, gradients 6.3e-3.
ATTENTION_TOLERANCE = {"output": 2e-2, "lse": 2e-2, "gradients": 3e-2}


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


def random_experts(shape: Shape, rows: int, gen) -> tuple:
    """(tokens per expert, `rows` routed rows [rows, H], ExpertWeights), random, bf16, rows grouped by expert."""
    import torch

    from neuron_qwen3.moe.layout import ExpertWeights

    counts = torch.bincount(torch.randint(0, shape.experts, (rows,), generator=gen), minlength=shape.experts)
    x = torch.randn(rows, shape.dim, generator=gen).to(torch.bfloat16)
    weights = ExpertWeights(
        *(
            torch.randn(shape.experts, *dims, generator=gen).div(dims[1] ** 0.5).to(torch.bfloat16)
            for dims in ((shape.hidden, shape.dim), (shape.hidden, shape.dim), (shape.dim, shape.hidden))
        )
    )
    return counts, x, weights


def compare_decode(shape: Shape, device: str, lnc: int = 2, seed: int = 0) -> str:
    """A decode step's routed rows through moe_tkg on `device` against reference_forward on CPU, in bf16."""
    import torch

    from neuron_qwen3.moe import nki_kernels
    from neuron_qwen3.moe.layout import ExpertWeights, presorted_block_layout, presorted_row_experts, unit_affinities
    from neuron_qwen3.moe.reference import TOLERANCE, reference_forward

    gen = torch.Generator().manual_seed(seed)
    rows = DECODE_SLOTS * shape.top_k
    counts, x, weights = random_experts(shape, rows, gen)
    layout = presorted_block_layout(counts, rows, shape.block_size)
    padded = torch.cat([x, torch.zeros(1, shape.dim, dtype=x.dtype)])
    ref_out, *_ = reference_forward(padded, unit_affinities(layout, shape.experts, x.dtype), weights, layout)
    on_device = ExpertWeights(*(w.to(device) for w in (weights.w1_EFD, weights.w3_EFD, weights.w2_EDF)))
    out = nki_kernels.moe_tkg_forward(x.to(device), presorted_row_experts(counts, rows).to(device), on_device, lnc)
    tolerance = TOLERANCE["bfloat16"]["output"]
    error = relative_error(out, ref_out)
    verdict = f"decode H={shape.dim} I={shape.hidden} E={shape.experts} {rows} rows: output error {error:.1e} "
    verdict += f"(tolerance {tolerance:g})"
    if not error <= tolerance:
        raise Failed(verdict)
    return verdict


def compare_kernels(shape: Shape, device: str, lnc: int = 2, seed: int = 0) -> str:
    """The op on `device` (the NKI kernels on Neuron) against reference_forward/backward on CPU, in bf16."""
    import torch

    from neuron_qwen3.moe.experts import blockwise_moe_experts
    from neuron_qwen3.moe.layout import (
        BlockLayout,
        ExpertWeights,
        max_num_blocks,
        presorted_block_layout,
        unit_affinities,
    )
    from neuron_qwen3.moe.reference import TOLERANCE, reference_backward, reference_forward

    gen = torch.Generator().manual_seed(seed)
    rows = shape.tokens * shape.top_k
    counts, x, weights = random_experts(shape, rows, gen)
    layout = presorted_block_layout(
        counts, rows, shape.block_size, max_num_blocks(rows, shape.experts, shape.block_size)
    )
    dtype = torch.bfloat16
    x = torch.cat([x, torch.zeros(1, shape.dim, dtype=dtype)])  # the kernels' padding row
    affinities = unit_affinities(layout, shape.experts, dtype)
    grad_out = torch.randn(rows, shape.dim, generator=gen).to(dtype)

    ref_out, *checkpoints = reference_forward(x, affinities, weights, layout)
    ref_grads = reference_backward(grad_out, x, affinities, weights, tuple(checkpoints), layout)

    to = lambda t: t.detach().to(device).requires_grad_(t.is_floating_point())  # noqa: E731
    dev_x, dev_w = to(x), [to(w) for w in (weights.w1_EFD, weights.w3_EFD, weights.w2_EDF)]
    dev_layout = BlockLayout(
        layout.token_position_to_id.to(device), layout.block_to_expert.to(device), layout.num_tokens, layout.block_size
    )
    out = blockwise_moe_experts(dev_x, affinities.to(device), ExpertWeights(*dev_w), dev_layout, "nki", lnc)
    out.backward(grad_out.to(device))

    tolerance = TOLERANCE["bfloat16"]
    out_err = relative_error(out, ref_out)
    # The padding row's input gradient is not compared: NKIGroupedExperts drops it (it is its own zero row).
    grad_err = max(
        relative_error(got, want)
        for got, want in zip([dev_x.grad[:rows], *(w.grad for w in dev_w)], [ref_grads[0][:rows], *ref_grads[2:]])
    )
    verdict = (
        f"H={shape.dim} I={shape.hidden} E={shape.experts} B={shape.block_size}: output error "
        f"{out_err:.1e} (tolerance {tolerance['output']:g}), gradients {grad_err:.1e} "
        f"(tolerance {tolerance['gradients']:g})"
    )
    if not (out_err <= tolerance["output"] and grad_err <= tolerance["gradients"]):
        raise Failed(verdict)
    return verdict


def compare_attention(shape: AttentionShape, device: str, lnc: int = 2, seed: int = 0) -> str:
    """attention_forward/backward on `device` (nkilib's kernels on Neuron), the backward fed the forward's own out
    and lse, against reference_forward/backward on CPU, in bf16."""
    import torch

    from neuron_qwen3.attention import nki_kernels
    from neuron_qwen3.attention.reference import reference_backward, reference_forward

    gen = torch.Generator().manual_seed(seed)
    starts = torch.stack(
        [torch.cat([torch.full((n,), sum(row[:i])) for i, n in enumerate(row)]) for row in shape.documents]
    ).to(torch.int32)
    batch, length = starts.shape
    heads = lambda h: torch.randn(batch, h, length, shape.head_dim, generator=gen).to(torch.bfloat16)  # noqa: E731
    q, k, v, grad_out = heads(shape.heads), heads(shape.kv_heads), heads(shape.kv_heads), heads(shape.heads)
    scale = shape.head_dim**-0.5

    ref_out, ref_lse = reference_forward(q, k, v, starts, scale)
    ref_grads = reference_backward(grad_out, q, k, v, ref_out, ref_lse, starts, scale)

    dev_q, dev_k, dev_v, dev_starts, dev_grad = (t.to(device) for t in (q, k, v, starts, grad_out))
    out, lse = nki_kernels.attention_forward(dev_q, dev_k, dev_v, dev_starts, scale, lnc)
    grads = nki_kernels.attention_backward(dev_grad, dev_q, dev_k, dev_v, out, lse, dev_starts, scale, lnc)

    tolerance = ATTENTION_TOLERANCE
    out_err = relative_error(out, ref_out)
    lse_err = float((lse.detach().float().cpu() - ref_lse.float()).abs().max())
    grad_err = max(relative_error(got, want) for got, want in zip(grads, ref_grads))
    windows = ", ".join("+".join(map(str, row)) for row in shape.documents)
    verdict = (
        f"D={shape.head_dim} Hq={shape.heads} Hkv={shape.kv_heads} L={length} documents {windows}: output error "
        f"{out_err:.1e} (tolerance {tolerance['output']:g}), lse {lse_err:.1e} (tolerance {tolerance['lse']:g}), "
        f"gradients {grad_err:.1e} (tolerance {tolerance['gradients']:g})"
    )
    if not (out_err <= tolerance["output"] and lse_err <= tolerance["lse"] and grad_err <= tolerance["gradients"]):
        raise Failed(verdict)
    return verdict


def kernel_checks(lnc: int) -> str:
    """`nki_moe LNC`, in this process: every shape at this LNC (the runtime's, set by check_kernels)."""
    import torch_neuronx  # noqa: F401  the neuron device, before the kernels' tensors need it

    verdicts = [compare_kernels(shape, "neuron", lnc) for shape in SHAPES]
    return "; ".join(verdicts + [compare_decode(shape, "neuron", lnc) for shape in SHAPES])


def attention_checks(lnc: int) -> str:
    """`attention LNC`, in this process: every attention shape at this LNC."""
    import torch_neuronx  # noqa: F401  the neuron device, before the kernels' tensors need it

    return "; ".join(compare_attention(shape, "neuron", lnc) for shape in ATTENTION_SHAPES)


# The checks that run in a child process per LNC: `python -m neuron_qwen3.prelaunch.selftest NAME LNC`.
CHILD_CHECKS = {"nki_moe": kernel_checks, "attention": attention_checks}


def check_kernels(lnc: int, name: str = "nki_moe") -> str:
    from neuron_qwen3.quirks import devices

    # The compiler's --lnc must equal the runtime's (error NCC_EVRF066); the last --lnc in NEURON_CC_FLAGS wins.
    env = devices.environment(
        NEURON_LOGICAL_NC_CONFIG=str(lnc),
        NEURON_RT_VISIBLE_CORES="0",
        NEURON_CC_FLAGS=f"{devices.environment().get('NEURON_CC_FLAGS', '')} --lnc={lnc}",
    )
    result = subprocess.run(
        [sys.executable, "-m", "neuron_qwen3.prelaunch.selftest", name, str(lnc)],
        env=env,
        capture_output=True,
        text=True,
    )
    last = (result.stdout.strip().splitlines() or [""])[-1].removeprefix(PREFIX)
    if result.returncode or not last.startswith("PASS "):
        tail = (
            last.partition(": ")[2]
            if last.startswith("FAIL ")
            else (result.stderr.strip().splitlines() or ["no output"])[-1]
        )
        raise Failed(f"the LNC {lnc} {name} checks stopped (exit {result.returncode}): {tail}")
    return last.partition(": ")[2]


def losses(output: str) -> dict[int, float]:
    return {int(step): float(loss) for step, loss in re.findall(LOSS_LINE, re.sub(COLOUR, "", output))}


def native_verdict(returncode: int, output: str, steps: int) -> str:
    found = losses(output)
    if returncode or sorted(found) != list(range(1, steps + 1)) or not all(map(math.isfinite, found.values())):
        tail = (output.strip().splitlines() or ["no output"])[-1]
        raise Failed(f"exit {returncode}, losses {found}: {tail}")
    return "losses " + ", ".join(f"{found[step]:.3f}" for step in sorted(found))


def check_native(steps: int = 3) -> str:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=1",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "127.0.0.1:0",
        "--local-addr",
        "127.0.0.1",
        "-m",
        "torchtitan.train",
        "--module",
        "neuron_qwen3",
        "--config",
        "native_qwen3_smoke",
        "--device=neuron",
        f"--training.steps={steps}",
        "--dump_folder=/tmp/neuron-qwen3-self-test",
    ]
    from neuron_qwen3.quirks import devices

    env = devices.environment(NEURON_RT_VISIBLE_CORES="0", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    return native_verdict(result.returncode, result.stdout + result.stderr, steps)


def run_checks(checks, stream=None) -> int:
    """Run (name, check) pairs in order, one verdict line each; stop at the first failure (exit 1)."""
    for name, check in checks:
        try:
            detail = check()
        except Exception as error:  # a check's own bug is a failure too, in one line
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            print(f"{PREFIX}FAIL {name}: {reason}", file=stream or sys.stdout, flush=True)
            return 1
        print(f"{PREFIX}PASS {name}: {detail}", file=stream or sys.stdout, flush=True)
    return 0


CHECKS = (
    ("runtime", check_runtime),
    *(
        (f"{name} LNC {lnc}", lambda lnc=lnc, name=name: check_kernels(lnc, name))
        for name in CHILD_CHECKS
        for lnc in LNC_ORDER
    ),
    ("native", check_native),
)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] in CHILD_CHECKS and argv[1] in ("1", "2"):
        name, lnc = argv[0], int(argv[1])
        return run_checks([(f"{name} LNC {lnc}", lambda: CHILD_CHECKS[name](lnc))])
    return run_checks(CHECKS)


if __name__ == "__main__":
    sys.exit(main())
