"""Every chat template a model folder carries, `{% generation %}` markers included (quirks/chat_template.py).

TRL's `qwen3_training.jinja` (from the installed trl, as a TRL fine-tune saves it with the model), in a tokenizer
folder as chat_template.jinja and as tokenizer_config.json's chat_template: torchtitan's own tokenizer loads it
only with the quirk (stock torchtitan fails in the constructor); the ids equal transformers' rendering and the
loss mask equals its `return_assistant_tokens_mask`, less what the project leaves out by design (an empty think
block; the newline after `<|im_end|>`); a fine-tune from such a folder trains. A template that does not compile,
or refuses the data, stops the launch in one line.
Run: .venv/bin/python -m pytest tests/test_chat_template.py -q
"""

import importlib.resources
import json
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, worker_env
from test_data_masks import CONVERSATIONS, TOOLS
from test_finetune import tiny_qwen3
from test_validation import write_jsonl

SMOKE_TOKENIZER = REPO / "recipes" / "neuron_qwen3" / "assets" / "tokenizer"
TRL_TEMPLATE = (importlib.resources.files("trl") / "chat_templates" / "qwen3_training.jinja").read_text()
LEFT_OUT = re.compile(r"<think>\s*</think>\n*|(?<=<\|im_end\|>)\n")  # never trained here (data/tokens.py)
STOCK = (
    "import sys; from torchtitan.components.tokenizer import HuggingFaceTokenizer; "
    "HuggingFaceTokenizer(tokenizer_path=sys.argv[1])"
)


def folder_with(tmp_path, template: str, inline: bool):
    """The smoke tokenizer with `template` as chat_template.jinja, or inline in tokenizer_config.json."""
    folder = tmp_path / ("inline" if inline else "file")
    shutil.copytree(SMOKE_TOKENIZER, folder)
    (folder / "chat_template.jinja").unlink()
    if inline:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    else:
        (folder / "chat_template.jinja").write_text(template)
    return folder


@pytest.mark.parametrize("inline", [False, True])
def test_stock_torchtitan_cannot_load_a_generation_template_and_the_quirk_can(tmp_path, inline):
    folder = folder_with(tmp_path, TRL_TEMPLATE, inline)
    stock = subprocess.run([sys.executable, "-c", STOCK, str(folder)], capture_output=True, text=True)
    assert stock.returncode != 0 and "Encountered unknown tag 'generation'" in stock.stderr
    fixed = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from neuron_qwen3.quirks import chat_template; chat_template.apply(); {STOCK}",
            str(folder),
        ],
        capture_output=True,
        text=True,
    )
    assert fixed.returncode == 0, fixed.stderr[-2000:]


@pytest.mark.training  # imports transformers and torchtitan
@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_trls_template_masks_are_transformers_less_what_is_left_out(tmp_path, inline, name):
    import transformers
    from torchtitan.components.loss import IGNORE_INDEX
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3.data.tokens import Encoder

    folder = str(folder_with(tmp_path, TRL_TEMPLATE, inline))
    messages, tools = CONVERSATIONS[name], (TOOLS["tools"] if name == "tools" else None)
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    theirs = hf.apply_chat_template(
        messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    text = hf.apply_chat_template(messages, tools=tools, tokenize=False)
    offsets = hf(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    left_out = [(m.start(), m.end()) for m in LEFT_OUT.finditer(text)]
    expected = [
        int(mask and not any(start < end_ and s < end for s, end_ in left_out))
        for mask, (start, end) in zip(theirs["assistant_masks"], offsets)
    ]
    doc = Encoder(HuggingFaceTokenizer(tokenizer_path=folder)).chat(messages, tools)
    assert doc.ids == theirs["input_ids"]
    assert [int(label != IGNORE_INDEX) for label in doc.labels] == expected[1:]
    assert doc.trained > 0


def chat_data(tmp_path):
    return write_jsonl(
        tmp_path / "chat.jsonl",
        [{"messages": CONVERSATIONS[name]} for name in sorted(CONVERSATIONS) if name != "tools"] * 4,
    )


def launch(tmp_path, *args, **env):
    env = worker_env(
        SCALE="smoke",
        OUTPUT_DIR=str(tmp_path / "out"),
        CACHE_DIR=str(tmp_path / "cache"),
        DATASET_FIELD="messages",
        DATASET=chat_data(tmp_path),
        **env,
    )
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
    )


@pytest.mark.training
def test_a_fine_tune_from_a_folder_with_trls_template_trains(tmp_path):
    base = tiny_qwen3(tmp_path / "base")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SMOKE_TOKENIZER / name, base / name)
    (base / "chat_template.jinja").write_text(TRL_TEMPLATE)
    result = launch(tmp_path, INIT_FROM=str(base), STEPS="2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"data: tokenizer and chat template of {base}" in result.stdout + result.stderr
    records = (tmp_path / "out" / "report" / "metrics.jsonl").read_text().splitlines()
    assert len(records) == 2 and all(json.loads(line)["loss"] > 0 for line in records)


@pytest.mark.training
@pytest.mark.parametrize(
    "template, says",
    [
        ("{% for message in messages %}{{ message.content }}{% endfor", "does not compile: "),
        (
            "{{ raise_exception('this template takes no user turns') }}",
            "the chat template refused it: this template takes no user turns",
        ),
    ],
)
@pytest.mark.parametrize("epochs", [{}, {"EPOCHS": "1"}], ids=["steps", "epochs"])  # EPOCHS' plan tokenizes
def test_a_template_that_cannot_render_stops_before_launch_in_one_line(tmp_path, template, says, epochs):
    base = tiny_qwen3(tmp_path / "base")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SMOKE_TOKENIZER / name, base / name)
    (base / "chat_template.jinja").write_text(template)
    result = launch(tmp_path, "--check", INIT_FROM=str(base), **epochs)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if "DATASET:" in line]
    assert len(lines) == 1 and says in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
