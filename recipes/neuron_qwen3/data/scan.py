"""`scan`: every record of a local DATASET read as the workers read it, for the pre-launch pass."""

from dataclasses import dataclass, field

from neuron_qwen3.data import conversations, pairs
from neuron_qwen3.data.conversations import Problem
from neuron_qwen3.data.dataset import COUNTS, count, documents
from neuron_qwen3.data.records import DataError, local_table
from neuron_qwen3.data.tokens import Encoder


@dataclass
class Scan:
    problem: str | None  # the first problem, one line naming the file and the line or row; None: none
    kind: str | None = None  # text, chat or pair, from the first record
    counts: dict = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))  # what was read up to it


def scan(
    path: str,
    field: str = "text",
    train_on: str = "assistant",
    tokenizer_folder: str | None = None,
    seq_len: int = 2048,
) -> Scan:
    """Read every record of `path` (a file or a folder of one kind). With `tokenizer_folder` each one is also
    rendered, tokenized and masked (template errors found, tokens counted); without it, formats only."""
    result = Scan(None)
    encoder = None
    if tokenizer_folder:
        from torchtitan.components.tokenizer import HuggingFaceTokenizer

        encoder = Encoder(HuggingFaceTokenizer(tokenizer_path=tokenizer_folder), train_on)
    try:
        table = local_table(path)
        for i in range(len(table)):
            record = table.record(i)
            try:
                result.kind = result.kind or conversations.kind(record, field)
                found = result.kind
                if encoder and found != "prompt":  # a prompt is rendered by the generator's side (rl/rollout.py)
                    count(result.counts, *documents(record, found, field, encoder, seq_len))
                elif found == "prompt":
                    conversations.prompt(record)
                    result.counts["records"] += 1
                elif found == "pair":
                    pairs.pair(record)
                    result.counts["records"] += 1
                elif found == "chat":
                    turns = len(conversations.conversation(record, field)[0])
                    result.counts["records"] += 1
                    result.counts["turns"] += turns
                else:
                    conversations.text(record, field)
                    result.counts["records"] += 1
            except Problem as problem:
                raise DataError(f"{table.origin(i)}: {problem}") from None
    except DataError as error:
        result.problem = str(error)
    return result


def render_first(path: str, field: str, train_on: str, tokenizer_folder: str) -> str | None:
    """The first record of a local chat DATASET rendered with the run's tokenizer and chat template, as the workers
    render it: a template that does not compile, or refuses this data, is one line before launch instead of a
    traceback in every worker. None: it renders (or the data is text)."""
    import jinja2
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    table = local_table(path)
    record = table.record(0)
    try:
        if conversations.kind(record, field) != "chat":
            return None
    except Problem:
        return None  # the record's own fault, not the template's: the format scan names it with its line
    try:
        encoder = Encoder(HuggingFaceTokenizer(tokenizer_path=tokenizer_folder), train_on)
    except jinja2.TemplateError as error:
        return f"the chat template of {tokenizer_folder} does not compile: {str(error).splitlines()[0]}"
    try:
        encoder.chat(*conversations.conversation(record, field))
    except Problem as problem:
        return f"{table.origin(0)}: {problem} (the chat template of {tokenizer_folder})"
    return None


def method_problem(method: str, kind: str | None, path: str, setting: str = "DATASET") -> str | None:
    """The data's kind against METHOD: preference pairs train with dpo, prompts alone with grpo, and only they do;
    `setting` names where the data came from (DATASET or VALIDATION)."""
    wanted = {"dpo": "pair", "grpo": "prompt"}
    if kind is None or wanted.get(method) == kind or (method not in wanted and kind not in wanted.values()):
        return None
    if method == "dpo":
        return (
            f"{setting}: {path} holds {kind} records; METHOD=dpo trains on preference pairs (prompt, chosen, rejected)"
        )
    if method == "grpo":
        return f"{setting}: {path} holds {kind} records; METHOD=grpo trains on prompt-only records (a `prompt` field)"
    if kind == "pair":
        return f"{setting}: {path} holds preference pairs (chosen, rejected): train them with METHOD=dpo"
    return f"{setting}: {path} holds prompt-only records (no completion): train them with METHOD=grpo"
