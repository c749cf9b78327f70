"""transformers reads the bundled smoke tokenizer, and a smoke model's export, as the project tokenizes.

The project tokenizes with the folder's tokenizer.json as it is (torchtitan's HuggingFaceTokenizer). transformers'
AutoTokenizer, on the bundled folder and on an export (whose config.json says qwen3), gives the same ids: for text
with digits and for a chat template's conversation. make_assets.py writes the committed tokenizer_config.json.
Run: .venv/bin/python -m pytest tests/test_smoke_tokenizer.py -q
"""

import importlib.util
import json

import pytest

from test_data_masks import CONVERSATIONS, TOOLS
from test_export import trainer

from neuron_qwen3 import config_registry
from neuron_qwen3.hf import weights

TEXTS = ("What is 2+2?", "What is 2+2? 12345 and 3.14", "x**2 + 12345", "Café 東京 🙂", "  spaces   and\n\n\ttabs")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The bundled tokenizer folder and a float32 export of the dense smoke model (its tokenizer is the bundled)."""
    target = tmp_path_factory.mktemp("export") / "out"
    weights.export(trainer("native_qwen3_smoke", target, dtype="float32"))
    assert json.loads((target / "config.json").read_text())["model_type"] == "qwen3"
    return {"bundled": config_registry.SMOKE_TOKENIZER, "export": target}


@pytest.mark.parametrize("which", ["bundled", "export"])
def test_transformers_gives_the_projects_ids(folders, which):
    import transformers
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3.data.tokens import Encoder

    ours = HuggingFaceTokenizer(tokenizer_path=str(config_registry.SMOKE_TOKENIZER))
    theirs = transformers.AutoTokenizer.from_pretrained(folders[which])
    for text in TEXTS:
        assert theirs(text, add_special_tokens=False)["input_ids"] == ours.encode(text), text
    for name, messages in sorted(CONVERSATIONS.items()):
        tools = TOOLS["tools"] if name == "tools" else None
        rendered = theirs.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True)["input_ids"]
        assert rendered == Encoder(ours).chat(messages, tools).ids, name
    generation = json.loads((config_registry.SMOKE_TOKENIZER / "generation_config.json").read_text())
    assert theirs.eos_token_id == ours.eos_id and theirs.pad_token_id == generation["pad_token_id"]


def test_make_assets_writes_the_committed_tokenizer_config(tmp_path):
    spec = importlib.util.spec_from_file_location("make_assets", config_registry.ASSETS / "make_assets.py")
    make_assets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_assets)
    make_assets.write_tokenizer_config(tmp_path)
    written = (tmp_path / "tokenizer_config.json").read_bytes()
    assert written == (config_registry.SMOKE_TOKENIZER / "tokenizer_config.json").read_bytes()
