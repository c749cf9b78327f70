"""What the generator takes from a run: its tokenizer and the tokens an answer stops at, prompts read from a file
(SAMPLE_PROMPTS, the offline command's), and whether a round keeps the weights gathered in a rank's memory. The
run's samples (report/samples.py), GRPO's rollout (rl/) and the offline command (__main__.py) share them.
"""

import os
from dataclasses import dataclass

import torch

from neuron_qwen3 import shapes
from neuron_qwen3.data import conversations, records
from neuron_qwen3.data.conversations import Problem
from neuron_qwen3.data.records import DataError
from neuron_qwen3.data.tokens import IM_END, Encoder, chat_template
from neuron_qwen3.generate.plan import Plan, gathers_once


@dataclass
class Prompt:
    origin: str  # file:line
    text: str  # the last user turn, as the report shows it
    thinking: bool | None  # enable_thinking for the template; None: its default
    ids: list


CONVERSATION_FIELDS = ("messages", "conversations")  # OpenAI's and ShareGPT's, as DATASET_FIELD names them


def field_of(config) -> str:
    """The field a prompt's conversation is looked for in first: DATASET_FIELD when it names one, else `messages`."""
    return config.dataloader.field if config.dataloader.field != "text" else "messages"


def prompt_field(record: dict, preferred: str) -> str:
    """The field that holds this prompt record's conversation, whichever accepted form the file is in: `preferred`
    (DATASET_FIELD's) when the record has it, else OpenAI's `messages` or ShareGPT's `conversations`; a `prompt`
    record needs none. A prompts file need not be in the training data's form."""
    return next((name for name in (preferred, *CONVERSATION_FIELDS) if name in record), preferred)


def tokenizer_of(config):
    """torchtitan's tokenizer of the folder whose chat template the run renders with (finish.py sets it)."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    return HuggingFaceTokenizer(
        tokenizer_path=getattr(config.dataloader, "tokenizer_folder", "") or config.hf_assets_path
    )


def read_prompts(path: str, field: str, tokenizer, room: int) -> list[Prompt]:
    """Every record of `path` as a prompt to answer: the conversation without trailing assistant turns, rendered
    with the generation prompt; `room`: the most prompt tokens a window leaves. A bad record: DataError, one line
    with its file and line."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    table = records.local_table(path)
    if not len(table):
        raise DataError(f"SAMPLE_PROMPTS={path}: holds no record")
    encoder = Encoder(tokenizer)
    prompts = []
    for i in range(len(table)):
        record = table.record(i)
        try:
            messages, tools = conversations.conversation(record, prompt_field(record, field), answered=False)
            while messages and messages[-1]["role"] == "assistant":
                messages = messages[:-1]
            if not messages or messages[-1]["role"] == "system":
                raise Problem("no user or tool turn to answer")
            thinking = conversations.thinking_of(record)
            ids = encoder.prompt(messages, tools, thinking)
        except Problem as problem:
            raise DataError(f"{table.origin(i)}: {problem}") from None
        if len(ids) > room:
            raise DataError(
                f"{table.origin(i)}: {len(ids)} prompt tokens; the window leaves {room} beside "
                "SAMPLE_TOKENS: shorten the prompt or lower SAMPLE_TOKENS"
            )
        last = next(m for m in reversed(messages) if m["role"] in ("user", "tool"))
        prompts.append(Prompt(table.origin(i), last.get("content") or "", thinking, ids))
    return prompts


def stop_ids(tokenizer) -> set:
    """The tokens an answer ends at: the template's end of turn, and the tokenizer's end of text."""
    ids = {tokenizer.tokenizer.token_to_id(IM_END)}
    eos = chat_template(tokenizer.tokenizer_path)[1].get("eos_token")
    if eos:
        ids.add(tokenizer.tokenizer.token_to_id(eos))
    return ids - {None}


def itemsize_of(config) -> int:
    """Bytes per value of the weights FSDP gathers and the KV cache holds: the mixed-precision parameter dtype."""
    return torch.empty(0, dtype=getattr(torch, config.training.mixed_precision_param)).element_size()


def rank_memory_gib(config) -> float | None:
    """A rank's device memory, in a worker: a trn2 logical NeuronCore's, a CUDA device's own; None on CPU."""
    if config.device == "neuron":
        return shapes.NEURON_GIB_PER_CORE[config.neuron.logical_nc_config]
    if config.device == "cuda":
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30
    return None


def gathering(config, plan: Plan, memory_gib: float | None) -> tuple:
    """Whether the generator keeps the weights gathered for a round, the bytes that takes and the line saying so
    (generate/plan.py), for the run's model."""
    shape, itemsize = shapes.of_run(config), itemsize_of(config)
    working = plan.cache_bytes(shape.n_layers, shape.n_kv_heads, shape.head_dim, itemsize) + plan.prefill_bytes(
        shape.n_heads, shape.hidden_dim * max(1, shape.top_k), itemsize
    )
    return gathers_once(shape.parameters() * itemsize, shape.layer_parameters() * itemsize, working, memory_gib)
