"""Prompts for the generator, in every form the project takes them, read in one place: the samples, GRPO's
rollout and validation, the offline command and the pre-launch pass all come here, so each form, the thinking
switch and the room a window leaves are checked once and the same way before launch and in the workers.

Two kinds: a conversation to answer (SAMPLE_PROMPTS and the offline command: DATASET_FIELD's, OpenAI's `messages`,
ShareGPT's `conversations`, or a `prompt`; trailing assistant turns dropped), and TRL's prompt-only record
(METHOD=grpo: a string as is, as TRL tokenizes it, or messages through the chat template).
"""

import os
from dataclasses import dataclass

from neuron_qwen3.data import conversations, records
from neuron_qwen3.data.conversations import Problem
from neuron_qwen3.data.records import DataError
from neuron_qwen3.data.tokens import Encoder

CONVERSATION_FIELDS = ("messages", "conversations")  # OpenAI's and ShareGPT's, as DATASET_FIELD names them


@dataclass
class Prompt:
    origin: str  # file:line
    text: str  # the last user turn, as the report shows it
    thinking: bool | None  # enable_thinking for the template; None: its default
    ids: list


def field_of(config) -> str:
    """The field a prompt's conversation is looked for in first: DATASET_FIELD when it names one, else `messages`."""
    return config.dataloader.field if config.dataloader.field != "text" else "messages"


def prompt_field(record: dict, preferred: str) -> str:
    """The field that holds this prompt record's conversation, whichever accepted form the file is in: `preferred`
    (DATASET_FIELD's) when the record has it, else OpenAI's `messages` or ShareGPT's `conversations`; a `prompt`
    record needs none. A prompts file need not be in the training data's form."""
    return next((name for name in (preferred, *CONVERSATION_FIELDS) if name in record), preferred)


def fits(origin: str, ids: list, room: int, beside: str, remedy: str) -> None:
    """DataError naming `origin` when a prompt of `ids` leaves too little of the window for `beside` (the setting
    whose tokens the answer takes)."""
    if len(ids) > room:
        raise DataError(f"{origin}: {len(ids)} prompt tokens; the window leaves {room} beside {beside}: {remedy}")


def to_answer(origin: str, record: dict, field: str, encoder: Encoder, room: int) -> Prompt:
    """A conversation record as a prompt to answer: without its trailing assistant turns, rendered with the
    generation prompt; at most `room` tokens beside SAMPLE_TOKENS."""
    try:
        messages, tools = conversations.conversation(record, prompt_field(record, field), answered=False)
        while messages and messages[-1]["role"] == "assistant":
            messages = messages[:-1]
        if not messages or messages[-1]["role"] == "system":
            raise Problem("no user or tool turn to answer")
        thinking = conversations.thinking_of(record)
        ids = encoder.prompt(messages, tools, thinking)
    except Problem as problem:
        raise DataError(f"{origin}: {problem}") from None
    fits(origin, ids, room, "SAMPLE_TOKENS", "shorten the prompt or lower SAMPLE_TOKENS")
    last = next(m for m in reversed(messages) if m["role"] in ("user", "tool"))
    return Prompt(origin, last.get("content") or "", thinking, ids)


def read_prompts(path: str, field: str, tokenizer, room: int) -> list[Prompt]:
    """Every record of `path` as a prompt to answer (`to_answer`); `room`: the most prompt tokens a window leaves.
    A bad record: DataError, one line with its file and line."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    table = records.local_table(path)
    if not len(table):
        raise DataError(f"SAMPLE_PROMPTS={path}: holds no record")
    encoder = Encoder(tokenizer)
    return [to_answer(table.origin(i), table.record(i), field, encoder, room) for i in range(len(table))]


def grpo_prompt(origin: str, record: dict, encoder: Encoder, room: int, max_completion: int) -> tuple:
    """TRL's prompt-only record as the generator takes it: (ids, the prompt as the rewards see it, conversational).
    DataError naming `origin` (file:line): a bad prompt, or one of over `room` tokens."""
    try:
        text, messages, tools = conversations.prompt(record)
        if messages is None:
            ids = encoder.tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
        else:
            ids = encoder.prompt(messages, tools, conversations.thinking_of(record))
    except Problem as problem:
        raise DataError(f"{origin}: {problem}") from None
    fits(
        origin,
        ids,
        room,
        f"GRPO_MAX_COMPLETION={max_completion}",
        "shorten the prompt, lower GRPO_MAX_COMPLETION or raise seq_len",
    )
    return ids, record["prompt"], messages is not None


def grpo_problem(named: list, tokenizer, room: int, max_completion: int) -> str | None:
    """The first prompt of the (setting, local file) pairs in `named` the rollout would refuse, as one line naming
    the setting, file and line; None when every prompt fits."""
    encoder = Encoder(tokenizer)
    for setting, path in named:
        table = records.local_table(path)
        for i in range(len(table)):
            try:
                grpo_prompt(table.origin(i), table.record(i), encoder, room, max_completion)
            except DataError as error:
                return f"{setting}: {error}"
    return None
