"""A packed batch's loss against the same conversations' losses one by one, for one variant's smoke model.

argv[1]: native, v5 or nki_moe (the config_registry smoke config, random weights as the trainer initialises them);
argv[2] (optional): "causal" builds v5 with the backend's plain causal mask, to show the check can fail.
Prints `packed=<loss> alone=<loss> rel=<relative difference>`; the loss is torchtitan's: the summed cross entropy
over the tokens that count, divided by their number (for the one-by-one side, summed over the conversations).
"""

import sys

from neuron_qwen3.quirks import cpu_adapter

cpu_adapter.activate()  # flex attention on CPU; before torchtitan.trainer is imported

import torch  # noqa: E402
from torchtitan.config.override import apply_overrides  # noqa: E402

from neuron_qwen3 import config_registry  # noqa: E402
from neuron_qwen3.data.packing import Packer, fit  # noqa: E402
from neuron_qwen3.data.tokens import Encoder  # noqa: E402

SEQ_LEN = 512  # longer than the smoke configs' windows: more conversations share one, more to leak if masks did
VARIANTS = {
    "native": config_registry.native_qwen3_smoke,
    "v5": config_registry.v5_qwen3_smoke,
    "nki_moe": config_registry.nki_moe_qwen3_smoke,
}


def conversations():
    """Eight conversations of one to four turns, a system turn and a tool call among them (cut to fit, as the
    loader cuts them)."""
    talks = []
    for i in range(8):
        messages = [{"role": "system", "content": "Answer briefly."}] if i % 2 else []
        for turn in range(1 + i % 4):
            messages += [{"role": "user", "content": f"{i}+{turn}?"}, {"role": "assistant", "content": f"{i + turn}"}]
        talks.append(messages)
    talks[3][-1:] = [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "add", "arguments": {"a": 3}}}]},
        {"role": "tool", "content": "6"},
        {"role": "assistant", "content": "6"},
    ]
    return talks


def model_of(config, causal: bool):
    if causal:
        from torchtitan.experiments.transformers_modeling_backend import model_registry

        config.model_spec = model_registry("full")
    if config.override.imports:  # nki_moe: its experts in float32, so both sides differ by fp32 noise only
        config.override.imports = [(config_registry.NKI_EXPERTS_OVERRIDE, {"compute_dtype": "float32"})]
        apply_overrides(config.override, config)
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = model_config.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return model.eval()


def loss_sum(model, inputs, labels, native: bool):
    positions = inputs["positions"]
    masks = {"attention_masks": model.get_attention_masks(positions)} if native else {}
    with torch.no_grad():
        logits = model(inputs["input"], positions=positions, **masks)
    total = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1).double(), labels.flatten(), ignore_index=-100, reduction="sum"
    )
    return total.item(), (labels != -100).sum().item()


def batch(docs, seq_len, pad_id):
    packer = Packer(seq_len, pad_id, whole=True)
    windows = []
    for doc in docs:
        packer.push(doc)
        while (window := packer.pop()) is not None:
            windows.append(window)
    windows.append(packer.flush())
    windows = [w for w in windows if w is not None]
    inputs = {k: torch.stack([w[0][k] for w in windows]) for k in ("input", "positions")}
    return inputs, torch.stack([w[1] for w in windows])


def main() -> None:
    variant, causal = sys.argv[1], sys.argv[2:] == ["causal"]
    if variant == "v5":
        from neuron_qwen3.quirks import hf_rope_fix

        hf_rope_fix.apply()  # as the v5 trainer does (v5.py): its RoPE table is computed, not left uninitialised
    config = VARIANTS[variant]()
    config.training.seq_len = SEQ_LEN  # the models size their RoPE tables from it
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    tokenizer = HuggingFaceTokenizer(tokenizer_path=config.hf_assets_path)
    encoder = Encoder(tokenizer)
    seq_len = SEQ_LEN
    docs = [piece for messages in conversations() for piece in fit(encoder.chat(messages), seq_len)[0]]
    model = model_of(config, causal)
    native = variant != "v5"
    packed_inputs, packed_labels = batch(docs, seq_len, tokenizer.eos_id)
    assert packed_inputs["input"].shape[0] < len(docs)  # conversations share windows
    packed, count = loss_sum(model, packed_inputs, packed_labels, native)
    alone = [loss_sum(model, *batch([doc], seq_len, tokenizer.eos_id), native) for doc in docs]
    one_by_one = sum(s for s, _ in alone) / sum(n for _, n in alone)
    assert count == sum(n for _, n in alone)
    packed /= count
    print(
        f"windows={packed_inputs['input'].shape[0]} packed={packed:.10f} alone={one_by_one:.10f} "
        f"rel={abs(packed - one_by_one) / one_by_one:.3e}"
    )


if __name__ == "__main__":
    main()
