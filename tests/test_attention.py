"""Document attention (attention/): the PyTorch reference against torchtitan's flex attention and transformers'.

Run: .venv/bin/python -m pytest tests/test_attention.py -q

The reference must compute what the models train with elsewhere, on the masks those components build themselves:
- torchtitan: flex attention's forward (eager) over the BlockMask of torchtitan's own causal and packed-document
  mask mods, and the CPU path's dense attention for the gradients (flex has no backward on CPU);
- transformers: a Qwen3 model on document attention (the v5 path) over a packed window, against transformers' eager
  attention on each document alone;
- torchtitan's Qwen3 smoke model: flex (the CPU stand-in) against the override.
Then finish(): which runs attend through the op, and the NKI kernels' limits as one line before launch.
"""

import re

import pytest
import torch
from torch.nn.attention.flex_attention import AuxRequest, and_masks, create_block_mask, create_mask, flex_attention
from torchtitan.models.common.attention import (
    get_causal_mask_mod,
    get_efficient_causal_mask_mod_for_packed_document,
)

from conftest import RECIPES

from neuron_qwen3 import neuron_sdk
from neuron_qwen3.attention import document, reference
from neuron_qwen3.attention.masks import DocumentMask, document_starts
from neuron_qwen3.quirks import cpu_adapter

# Documents per batch row (every window starts one, as the packing does), lengths not multiples of the reference's
# block, a document of one token.
DOCUMENTS = ([100, 77, 123, 60], [45, 1, 250, 64])
SCALE = 0.17


def packed_positions(documents=DOCUMENTS) -> torch.Tensor:
    return torch.stack([torch.cat([torch.arange(n) for n in lengths]) for lengths in documents])


def qkv(positions, q_heads=4, kv_heads=2, dim=32, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    batch, length = positions.shape

    def draw(heads):
        return torch.randn(batch, heads, length, dim, generator=generator, dtype=dtype).requires_grad_()

    return draw(q_heads), draw(kv_heads), draw(kv_heads)


def titan_block_mask(positions):
    """torchtitan's document mask (Decoder._create_flex_attention_mask_for_document), built eagerly."""
    batch, length = positions.shape
    mask_mod = and_masks(get_causal_mask_mod(), get_efficient_causal_mask_mod_for_packed_document(positions))
    return create_block_mask(mask_mod, batch, None, length, length, device="cpu")


def grads(out, tensors, seed=1):
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad(out, tensors, upstream)


def close(actual, expected, tolerance, what=""):
    error = ((actual - expected).abs().max() / expected.abs().max()).item()
    assert error < tolerance, f"{what} max error {error:.2e} relative to the largest value, over {tolerance:.0e}"


# ---- the masks ---------------------------------------------------------------------------------------------


def test_document_starts_follow_position_resets():
    starts = document_starts(packed_positions())
    assert starts[0, :100].eq(0).all() and starts[0, 100:177].eq(100).all() and starts[0, 300:].eq(300).all()
    assert starts[1, :45].eq(0).all() and starts[1, 45].item() == 45
    assert starts[1, 46:296].eq(46).all() and starts[1, 296:].eq(296).all()
    assert starts.dtype == torch.int32
    mid_document = document_starts(torch.tensor([[5, 6, 7, 0, 1]]))
    assert mid_document.tolist() == [[0, 0, 0, 3, 3]], "tokens before the first reset are one document from 0"


def test_document_starts_give_torchtitans_mask():
    positions = packed_positions()
    length = positions.shape[1]
    starts = document_starts(positions).long()
    key, query = torch.arange(length), torch.arange(length)[:, None]
    ours = (key >= starts[:, :, None]) & (key <= query)
    mask_mod = and_masks(get_causal_mask_mod(), get_efficient_causal_mask_mod_for_packed_document(positions))
    assert torch.equal(ours, create_mask(mask_mod, 2, 1, length, length, device="cpu")[:, 0])


# ---- the reference against torchtitan's flex attention ------------------------------------------------------


@pytest.mark.parametrize("q_heads, kv_heads", [(4, 2), (4, 4), (8, 1)])
def test_reference_forward_equals_flex_attention(q_heads, kv_heads):
    positions = packed_positions()
    q, k, v = (t.detach() for t in qkv(positions, q_heads, kv_heads))
    with torch.no_grad():
        expected, aux = flex_attention(
            q,
            k,
            v,
            block_mask=titan_block_mask(positions),
            scale=SCALE,
            enable_gqa=q_heads != kv_heads,
            return_aux=AuxRequest(lse=True),
        )
        out, lse = reference.reference_forward(q, k, v, document_starts(positions), SCALE)
    close(out, expected, 1e-5)
    close(lse, aux.lse, 1e-5)


@pytest.mark.parametrize("q_heads, kv_heads", [(4, 2), (8, 1)])
def test_op_gradients_equal_the_cpu_paths(q_heads, kv_heads):
    """The op's autograd (the reference backward) against the CPU path's dense attention over torchtitan's mask."""
    positions = packed_positions()
    q, k, v = qkv(positions, q_heads, kv_heads)
    expected, _ = cpu_adapter.dense_attention(q, k, v, titan_block_mask(positions), scale=SCALE, enable_gqa=True)
    out = document.document_attention_op(q, k, v, document_starts(positions), SCALE, "reference")
    close(out, expected, 1e-5)
    for ours, theirs, name in zip(grads(out, (q, k, v)), grads(expected, (q, k, v)), "qkv"):
        assert ours.dtype == theirs.dtype
        close(ours, theirs, 1e-5, name)


def test_float64_is_exact_to_rounding():
    positions = packed_positions()
    q, k, v = qkv(positions, dtype=torch.float64)
    expected, _ = cpu_adapter.dense_attention(q, k, v, titan_block_mask(positions), scale=SCALE, enable_gqa=True)
    out = document.document_attention_op(q, k, v, document_starts(positions), SCALE, "reference")
    close(out, expected, 1e-12)
    for ours, theirs in zip(grads(out, (q, k, v)), grads(expected, (q, k, v))):
        close(ours, theirs, 1e-12)


def test_bf16_keeps_float32_statistics():
    positions = packed_positions()
    q, k, v = (t.detach().bfloat16() for t in qkv(positions))
    out, lse = reference.reference_forward(q, k, v, document_starts(positions), SCALE)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    expected, _ = cpu_adapter.dense_attention(
        q.float(), k.float(), v.float(), titan_block_mask(positions), scale=SCALE, enable_gqa=True
    )
    close(out.float(), expected, 1e-2)


def test_a_wrong_mask_is_caught():
    """The comparisons can fail: a document boundary moved by one token changes the output."""
    positions = packed_positions()
    q, k, v = qkv(positions)
    expected, _ = cpu_adapter.dense_attention(q, k, v, titan_block_mask(positions), scale=SCALE, enable_gqa=True)
    starts = document_starts(positions)
    starts[0, 100:177] = 99
    out = document.document_attention_op(q, k, v, starts, SCALE, "reference")
    with pytest.raises(AssertionError, match="max error"):
        close(out, expected, 1e-5)


def test_the_op_is_a_registered_torch_op_with_fake_shapes():
    positions = packed_positions()
    q, k, v = (t.detach() for t in qkv(positions))
    torch.library.opcheck(
        torch.ops.neuron_qwen3.document_attention.default,
        (q, k, v, document_starts(positions), SCALE, "reference", 2),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_kernel_path_selection():
    assert neuron_sdk.kernel_path("auto", "neuron") == "nki"
    assert neuron_sdk.kernel_path("auto", "cpu") == neuron_sdk.kernel_path("auto", "cuda") == "reference"
    assert neuron_sdk.kernel_path("reference", "neuron") == "reference"
    assert neuron_sdk.kernel_path("nki", "cpu") == "nki"
    assert document.replaces_flex("auto", "neuron") and document.replaces_flex("reference", "cpu")
    assert not document.replaces_flex("auto", "cpu") and not document.replaces_flex("auto", "cuda")


# ---- transformers: the v5 path ---------------------------------------------------------------------------------


def hf_tiny_model(implementation: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(RECIPES / "neuron_qwen3/assets/hf_qwen3_tiny")
    if implementation == document.ATTENTION_NAME:
        document.use_in_transformers(config, "reference", 2)
    else:
        config._attn_implementation = implementation
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).float()


def test_transformers_model_on_a_packed_window_equals_each_document_alone_on_eager_attention():
    """Packing must not change what a document sees: the v5 path's function on a packed window (documents read from
    position_ids) against transformers' eager attention run on each document alone. Logits, and the gradients of a
    loss summed over tokens (so the documents' gradients add up)."""
    positions = packed_positions()
    tokens = torch.randint(0, 2048, positions.shape, generator=torch.Generator().manual_seed(2))
    eager, ours = hf_tiny_model("eager"), hf_tiny_model(document.ATTENTION_NAME)
    packed = ours(input_ids=tokens, position_ids=positions).logits
    packed.logsumexp(-1).sum().backward()
    for row, lengths in enumerate(DOCUMENTS):
        begin = 0
        for length in lengths:
            end = begin + length
            alone = eager(input_ids=tokens[row : row + 1, begin:end], position_ids=positions[row : row + 1, begin:end])
            alone.logits.logsumexp(-1).sum().backward()
            close(packed[row, begin:end].detach(), alone.logits[0].detach(), 1e-5)
            begin = end
    eager_grads = dict(eager.named_parameters())
    for name, parameter in ours.named_parameters():
        close(parameter.grad, eager_grads[name].grad, 1e-5, name)


def test_transformers_own_cpu_attention_ignores_packing():
    """Why the comparison above runs documents alone: on CPU, transformers' eager attention lets a packed window's
    documents see each other (it does not read documents from position_ids), so it is no reference for packing."""
    positions = packed_positions(([20, 30],))
    tokens = torch.randint(0, 2048, positions.shape, generator=torch.Generator().manual_seed(2))
    eager = hf_tiny_model("eager")
    alone = eager(input_ids=tokens[:, 20:], position_ids=positions[:, 20:]).logits
    packed = eager(input_ids=tokens, position_ids=positions).logits[:, 20:]
    assert (packed - alone).abs().max() > 1e-2


def test_transformers_without_positions_is_refused():
    model = hf_tiny_model(document.ATTENTION_NAME)
    with pytest.raises(ValueError, match="position_ids"):
        document.hf_document_attention(model, *(torch.zeros(1, 2, 4, 8),) * 3, None, kernel="reference", lnc=2)


# ---- torchtitan's Qwen3: flex's CPU stand-in against the override ------------------------------------------------


def test_torchtitan_qwen3_on_document_attention_equals_flex():
    from torchtitan.config.override import OverrideConfig, apply_overrides

    from neuron_qwen3 import config_registry
    from neuron_qwen3.finish import DOCUMENT_ATTENTION

    cpu_adapter.activate()
    positions = packed_positions(([100, 77, 79], [45, 1, 210]))
    tokens = torch.randint(0, 2048, positions.shape, generator=torch.Generator().manual_seed(3))
    outputs = []
    for swap in (False, True):
        config = config_registry.native_qwen3_smoke()
        if swap:
            apply_overrides(OverrideConfig(imports=[(DOCUMENT_ATTENTION, {"kernel": "reference"})]), config)
        torch.manual_seed(0)
        model = config.model_spec.model.build()
        model.init_states(buffer_device=None)
        masks = DocumentMask.of(positions) if swap else model.get_attention_masks(positions)
        logits = model(tokens, attention_masks=masks, positions=positions)
        logits.logsumexp(-1).sum().backward()
        outputs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (flex_logits, flex_grads), (ours_logits, our_grads) = outputs
    assert type(model.layers["0"].attention.inner_attention) is document.DocumentAttention
    close(ours_logits, flex_logits, 1e-5)
    for name, grad in flex_grads.items():
        close(our_grads[name], grad, 1e-5, name)


# ---- finish(): which runs attend through the op, and the kernels' limits before launch ---------------------------


def finished(config_name: str, kind: str, *flags):
    from neuron_qwen3.finish import finish
    from neuron_qwen3.prelaunch import preflight

    config, problem = preflight.parse_config(["--module", "neuron_qwen3", "--config", config_name, *flags], {})
    assert problem is None, problem
    return config, finish(config, 1, kind)


@pytest.mark.parametrize("config_name", ["native_qwen3_smoke", "nki_moe_qwen3_smoke"])
def test_finish_swaps_flex_on_neuron_or_when_forced(config_name):
    from neuron_qwen3.finish import DOCUMENT_ATTENTION

    def entries(config):
        return [e for e in config.override.imports if not isinstance(e, str) and e[0] == DOCUMENT_ATTENTION]

    config, done = finished(config_name, "cpu")
    assert entries(config) == [] and not any(line.startswith("attention:") for line in done.lines)
    config, done = finished(config_name, "cpu", "--neuron.attention_kernel=reference")
    assert entries(config) == [(DOCUMENT_ATTENTION, {"kernel": "reference", "logical_nc_config": 2})]
    assert "attention: document-causal, PyTorch reference (no Inductor)" in done.lines
    config, done = finished(config_name, "neuron", "--neuron.logical_nc_config=1")
    assert entries(config) == [(DOCUMENT_ATTENTION, {"kernel": "auto", "logical_nc_config": 1})]
    assert "attention: document-causal, nkilib kernels (no Inductor)" in done.lines


def test_finish_routes_the_transformers_model_through_the_function():
    config, _ = finished("v5_qwen3_smoke", "neuron", "--neuron.attention_kernel=reference")
    assert config.model_spec.model.attn_implementation == document.ATTENTION_NAME
    from transformers import AttentionInterface

    assert document.ATTENTION_NAME in AttentionInterface._global_mapping
    config, _ = finished("v5_qwen3_smoke", "cpu")
    assert config.model_spec.model.attn_implementation != document.ATTENTION_NAME


NOT_ON_NEURON = "needs a neuron device, and this run is on cpu (allowed here: auto, reference)"


@pytest.mark.parametrize(
    "config_name, kind, flags, message",
    [
        ("native_qwen3_smoke", "cpu", [], NOT_ON_NEURON),
        ("native_qwen3_smoke", "neuron", ["--training.seq_len=200"], "seq_len=200"),
        ("v5_qwen3_smoke", "neuron", ["--training.seq_len=200"], "seq_len=200"),
    ],
)
def test_the_nki_kernels_limits_are_one_line_before_launch(config_name, kind, flags, message):
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        finished(config_name, kind, "--neuron.attention_kernel=nki", *flags)
    assert "\n" not in str(raised.value)


def test_the_smoke_and_article_shapes_fit_the_kernels():
    finished("native_qwen3_smoke", "neuron", "--neuron.attention_kernel=nki")
    finished("v5_qwen3_smoke", "neuron", "--neuron.attention_kernel=nki")
