"""Preference pairs (METHOD=dpo) in TRL's three forms, as two documents that share their prompt:

- `prompt`, `chosen`, `rejected` as strings (text: no chat template; chosen and rejected end in EOS);
- `prompt` as messages (system prompts, tools, several turns), `chosen` and `rejected` as the assistant's;
- `chosen` and `rejected` as whole conversations (the implicit prompt: their longest common prefix of messages, as
  TRL's extract_prompt takes it; what follows must be the assistant's in both).

A conversation is rendered with the tokenizer's chat template exactly as SFT renders one (data/tokens.py). The
completion is what TRL's DPOTrainer takes: the tokens after the longest common prefix of the prompt rendered with
the generation prompt and the prompt + answer rendered whole (the turn's closing newline included), so the loss
and the rewards are TRL's on the same pair.
"""

from dataclasses import dataclass

from torchtitan.components.loss import IGNORE_INDEX

from neuron_qwen3.data import conversations
from neuron_qwen3.data.conversations import Problem, _short
from neuron_qwen3.data.tokens import Document

FIELDS = ("chosen", "rejected")


@dataclass
class Pair:
    prompt: object  # a string, or a list of messages
    chosen: object
    rejected: object
    tools: list | None = None


def is_pair(record: dict) -> bool:
    return isinstance(record, dict) and all(name in record for name in FIELDS)


def pair(record: dict) -> Pair:
    """The record's pair, checked; Problem names what is wrong."""
    chosen, rejected = record["chosen"], record["rejected"]
    if isinstance(chosen, str) or isinstance(rejected, str):
        for name in ("prompt", *FIELDS):
            if not isinstance(record.get(name), str):
                raise Problem(
                    f"{name} is not a string ({'missing' if name not in record else _short(record[name])})"
                    ": a text pair has prompt, chosen and rejected strings"
                )
        if chosen == rejected:
            raise Problem("chosen and rejected are the same")
        return Pair(record["prompt"], chosen, rejected)
    tools = conversations._tools(record.get("tools"))
    if "prompt" in record:
        prompt = _messages(record, "prompt", answered=False)
        chosen, rejected = (_messages(record, name, answered=True) for name in FIELDS)
    else:
        chosen, rejected = (_messages(record, name, answered=True) for name in FIELDS)
        prompt, chosen, rejected = _split(chosen, rejected)
    for name, answer in zip(FIELDS, (chosen, rejected)):
        if not answer or answer[0]["role"] != "assistant":
            raise Problem(f"{name}'s answer does not begin with an assistant message")
    if chosen == rejected:
        raise Problem("chosen and rejected are the same")
    if not prompt:
        raise Problem("the prompt is empty")
    return Pair(prompt, chosen, rejected, tools)


def _messages(record: dict, name: str, answered: bool) -> list:
    value = record.get(name)
    if isinstance(value, str) and name == "prompt":
        value = [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise Problem(f"{name} is not a list of messages: {_short(value)}")
    try:
        messages, _ = conversations.conversation({name: value}, name, answered=False)
    except Problem as problem:
        raise Problem(f"{name}: {problem}") from None
    return messages


def _split(chosen: list, rejected: list) -> tuple:
    """(prompt, chosen's answer, rejected's answer) of two whole conversations: the prompt is their longest common
    prefix of messages (TRL's extract_prompt), and each answer must begin with an assistant turn."""
    k = _common(chosen, rejected)
    if k == 0:
        raise Problem("chosen and rejected share no prompt (their first messages differ)")
    for name, messages in zip(FIELDS, (chosen, rejected)):
        if k < len(messages) and messages[k]["role"] != "assistant":
            role = messages[k]["role"]
            raise Problem(
                f"chosen and rejected have different prompts: message {k + 1} differs, a {role} turn in {name}"
            )
    return chosen[:k], chosen[k:], rejected[k:]


def _common(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def encode(p: Pair, encoder) -> tuple[Document, Document]:
    """(chosen, rejected) documents: the whole sequence, with labels on the completion's tokens only."""
    tokenizer = encoder.tokenizer.tokenizer
    if isinstance(p.prompt, str):
        eos = encoder.tokenizer.eos_token or ""
        prompt = tokenizer.encode(p.prompt, add_special_tokens=False).ids
        wholes = [
            tokenizer.encode(p.prompt + answer + ("" if answer.endswith(eos) else eos), add_special_tokens=False).ids
            for answer in (p.chosen, p.rejected)
        ]
    else:
        prompt = tokenizer.encode(
            encoder.render(p.prompt, p.tools, add_generation_prompt=True), add_special_tokens=False
        ).ids
        wholes = [
            tokenizer.encode(encoder.render(p.prompt + answer, p.tools), add_special_tokens=False).ids
            for answer in (p.chosen, p.rejected)
        ]
    start = max(1, min(_common(prompt, whole) for whole in wholes))
    docs = []
    for name, ids in zip(FIELDS, wholes):
        if len(ids) <= start:
            raise Problem(f"{name}'s completion has no tokens")
        docs.append(Document(ids, [IGNORE_INDEX] * (start - 1) + ids[start:], [], 0))
    if docs[0].ids == docs[1].ids:
        raise Problem("chosen and rejected render the same tokens")
    return docs[0], docs[1]
