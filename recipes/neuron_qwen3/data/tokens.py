"""How a record becomes tokens: text as torchtitan's tokenizer encodes it; a conversation as the tokenizer's own
chat template renders it, with the loss mask read from that one rendering.

The ids of a conversation are exactly transformers' `apply_chat_template(messages, tools=tools)`: the same
template, rendered by transformers' own Jinja renderer, tokenized without added special tokens. Which tokens
count in the loss is read from the ChatML turns of the rendered text (every Qwen3 template writes
`<|im_start|>role\\n ... <|im_end|>`), never by rendering prefixes again: Qwen3's template drops earlier turns'
`<think>` blocks, so a prefix is not what the whole conversation renders. Each token whose characters overlap a
trained span counts, as `return_assistant_tokens_mask` counts the tokens of a `{% generation %}` span.

TRAIN_ON (`train_on`):
- `assistant`: every assistant turn, from after its `<|im_start|>assistant\\n` header to its `<|im_end|>`
  included (its reasoning in `<think>`, content and tool calls, as the template wrote them); not the newline after.
- `last`: the final assistant turn only.
- `all`: every token.
An empty `<think></think>` block (what Qwen3's template writes for a turn without reasoning) never counts.
"""

import json
import os
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

from torchtitan.components.loss import IGNORE_INDEX

from neuron_qwen3.data.conversations import Problem
from neuron_qwen3.data.records import DataError
from neuron_qwen3.quirks import chat_template as template_compile

template_compile.apply()  # before any tokenizer is built: `{% generation %}` templates load (quirks/chat_template.py)

TRAIN_ON = ("assistant", "last", "all")
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
ASSISTANT = IM_START + "assistant\n"
EMPTY_THINK = re.compile(r"<think>\s*</think>\n*")
TEMPLATE_FILE = "chat_template.jinja"  # beside the tokenizer; else tokenizer_config.json's chat_template
SPECIALS = ("bos_token", "eos_token", "unk_token", "pad_token")  # what transformers hands every template


@dataclass
class Document:
    ids: list  # n tokens
    labels: list  # n - 1: the next token, or IGNORE_INDEX where it does not count
    turns: list = field(default_factory=list)  # token index where each turn starts: where it may be cut
    messages: int = 0  # a conversation's messages; 0 for text

    @property
    def trained(self) -> int:
        return sum(label != IGNORE_INDEX for label in self.labels)


def chat_template(folder: str) -> tuple[str, dict]:
    """The chat template of a tokenizer folder and the special tokens its rendering receives."""
    config_path = os.path.join(folder, "tokenizer_config.json")
    config = {}
    if os.path.isfile(config_path):
        with open(config_path) as f:
            config = json.load(f)
    specials = {}
    for name in SPECIALS:
        token = config.get(name)
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str):
            specials[name] = token
    if os.path.isfile(os.path.join(folder, TEMPLATE_FILE)):
        with open(os.path.join(folder, TEMPLATE_FILE)) as f:
            return f.read(), specials
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: transformers uses "default"
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if not isinstance(template, str):
        raise DataError(
            f"{folder}: the tokenizer has no chat template ({TEMPLATE_FILE} or tokenizer_config.json's "
            "chat_template): conversations need one"
        )
    return template, specials


def trained_spans(text: str, assistants: int, train_on: str) -> tuple[list, list]:
    """(character spans that count in the loss, character offset of each turn) of a rendered conversation."""
    turns = [m.start() for m in re.finditer(re.escape(IM_START), text)]
    ends = turns[1:] + [len(text)]
    replies, empty = [], []  # (start, end) of each assistant turn's trained part; empty think blocks
    for start, block_end in zip(turns, ends):
        if not text.startswith(ASSISTANT, start):
            continue
        body = start + len(ASSISTANT)
        end = text.rfind(IM_END, body, block_end)
        if end < 0:
            raise Problem(f"the chat template wrote an assistant turn without {IM_END}")
        think = EMPTY_THINK.match(text, body)
        if think and think.end() <= end:
            empty.append((body, think.end()))
            body = think.end()
        replies.append((body, end + len(IM_END)))
    if len(replies) != assistants:
        raise Problem(
            f"the chat template wrote {len(replies)} {ASSISTANT.strip()} turns for {assistants} assistant "
            "messages: the loss mask needs one per message"
        )
    if train_on == "assistant":
        return replies, turns
    if train_on == "last":
        return replies[-1:], turns
    spans, at = [], 0
    for start, end in empty:
        spans.append((at, start))
        at = end
    return spans + [(at, len(text))], turns


class Encoder:
    """Records to Documents with one tokenizer (torchtitan's, whose folder holds the chat template)."""

    def __init__(self, tokenizer, train_on: str = "assistant"):
        assert train_on in TRAIN_ON, f"train_on={train_on!r} is not one of {', '.join(TRAIN_ON)}"
        self.tokenizer, self.train_on = tokenizer, train_on
        self._template = None

    def text(self, value: str) -> Document:
        ids = self.tokenizer.encode(value, add_bos=True, add_eos=True)
        return Document(ids, ids[1:])

    def render(self, messages: list, tools: list | None, **options) -> str:
        """The whole conversation through the tokenizer's chat template, as transformers renders it; `options` go
        to the template (add_generation_prompt, enable_thinking)."""
        import jinja2
        from transformers.utils.chat_template_utils import render_jinja_template

        if self._template is None:
            self._template = chat_template(self.tokenizer.tokenizer_path)
        source, specials = self._template
        try:
            rendered, _ = render_jinja_template([messages], tools=tools, chat_template=source, **specials, **options)
        except jinja2.TemplateError as error:
            raise Problem(f"the chat template refused it: {str(error).splitlines()[0]}") from None
        return rendered[0]

    def prompt(self, messages: list, tools: list | None, thinking: bool | None) -> list:
        """The ids of a conversation to answer, ending in the template's generation prompt: what transformers'
        `apply_chat_template(..., add_generation_prompt=True, enable_thinking=thinking)` gives (None: the
        template's default)."""
        options = {"add_generation_prompt": True, **({} if thinking is None else {"enable_thinking": thinking})}
        return self.tokenizer.tokenizer.encode(self.render(messages, tools, **options), add_special_tokens=False).ids

    def chat(self, messages: list, tools: list | None = None) -> Document:
        text = self.render(messages, tools)
        spans, turns = trained_spans(text, sum(m["role"] == "assistant" for m in messages), self.train_on)
        encoding = self.tokenizer.tokenizer.encode(text, add_special_tokens=False)
        ids = encoding.ids
        starts = [start for start, _ in encoding.offsets]
        ends = [end for _, end in encoding.offsets]
        trained = bytearray(len(ids))
        for start, end in spans:  # the tokens that overlap [start, end)
            first, last = bisect_right(ends, start), bisect_left(starts, end)
            trained[first:last] = b"\x01" * max(0, last - first)
        labels = [token if keep else IGNORE_INDEX for token, keep in zip(ids[1:], trained[1:])]
        return Document(ids, labels, [bisect_right(ends, turn) for turn in turns], len(messages))
