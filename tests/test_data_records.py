"""Every bad record is one line naming the file, the line (or row) and what is wrong; none is skipped.

Each case is a small file whose first two records are good and whose third is bad (or a bad file or folder). The
same line comes from `scan()` (the pre-launch pass: the whole file, no tokenizer or the bundled one) and from
the DataLoader as a worker iterates it. Through the launcher: tests/test_finetune_chat.py.
Run: .venv/bin/python -m pytest tests/test_data_records.py -q
"""

import json

import pytest

pytestmark = pytest.mark.training  # imports torchtitan and datasets

GOOD_CHAT = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
GOOD_TEXT = {"text": "Some words."}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}],
}


def chat(*messages, **extra):
    return json.dumps({"messages": list(messages), **extra})


# name: (third line of a .jsonl, DATASET_FIELD, what the line says after "<file>:3: ")
LINE_CASES = {
    "invalid JSON": ('{"text": "no end', "text", "invalid JSON at column 10: Unterminated string starting"),
    "no field": (json.dumps({"body": "x"}), "text", "no field DATASET_FIELD='text' (the record has: body)"),
    "field not a string": (json.dumps({"text": 5}), "text", "DATASET_FIELD='text' is not a string: 5"),
    "not an object": ("[1, 2]", "text", "a record must be a JSON object, not [1, 2]"),
    "unknown role": (
        chat({"role": "bot", "content": "x"}, {"role": "assistant", "content": "y"}),
        "messages",
        "message 1: unknown role 'bot' (allowed: system, user, assistant, tool)",
    ),
    "no assistant turn": (chat({"role": "user", "content": "x"}), "messages", "no assistant turn: nothing to train on"),
    "content not a string": (
        chat({"role": "user", "content": "x"}, {"role": "assistant", "content": 42}),
        "messages",
        "message 2 (assistant): content is not a string: 42",
    ),
    "tool turn without a call": (
        chat(
            {"role": "user", "content": "x"}, {"role": "tool", "content": "18 C"}, {"role": "assistant", "content": "y"}
        ),
        "messages",
        "message 2: a tool result without a preceding assistant tool call",
    ),
    "text in a chat dataset": (
        json.dumps({"messages": "Hi"}),
        "messages",
        "DATASET_FIELD='messages' is not a list of messages: 'Hi'",
    ),
    "bad tools": (
        chat({"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}, tools="{"),
        "messages",
        "tools is not JSON: '{'",
    ),
    "tool call without a name": (
        chat(
            {"role": "user", "content": "x"},
            {**CALL, "tool_calls": [{"function": {}}]},
            {"role": "tool", "content": "r"},
            {"role": "assistant", "content": "y"},
        ),
        "messages",
        "message 2: a tool call needs a function name: {'function': {}}",
    ),
    "sharegpt unknown from": (
        json.dumps({"conversations": [{"from": "bot", "value": "x"}]}),
        "conversations",
        "message 1: unknown role from='bot' (allowed: human, gpt, system, function_call, observation)",
    ),
    "function_call not JSON": (
        json.dumps({"conversations": [{"from": "human", "value": "x"}, {"from": "function_call", "value": "f("}]}),
        "conversations",
        "message 2 (function_call): value is not JSON: 'f('",
    ),
}


def good(field):
    if field == "conversations":
        return json.dumps({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]})
    return json.dumps(GOOD_CHAT if field == "messages" else GOOD_TEXT)


def loader_line(path, field) -> str:
    """The DataError a worker's DataLoader raises, reading every window."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3 import config_registry, data

    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(config_registry.SMOKE_TOKENIZER))
    config = data.DataLoader.Config(source=str(path), field=field, infinite=False)
    with pytest.raises(data.DataError) as raised:
        list(config.build(dp_world_size=1, dp_rank=0, tokenizer=tokenizer, seq_len=256, local_batch_size=1))
    return str(raised.value)


@pytest.mark.parametrize("case", sorted(LINE_CASES))
def test_a_bad_line_is_named(tmp_path, case):
    from neuron_qwen3 import config_registry, data

    bad, field, what = LINE_CASES[case]
    path = tmp_path / "data.jsonl"
    path.write_text(f"{good(field)}\n{good(field)}\n\n{bad}\n")  # a blank line is no record, and is counted
    expected = f"{path}:4: {what}"
    for tokenizer in (None, str(config_registry.SMOKE_TOKENIZER)):
        found = data.scan(str(path), field, tokenizer_folder=tokenizer)
        assert found.problem == expected
        assert found.counts["records"] == 2
    assert loader_line(path, field) == expected


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


def test_bad_files_and_rows(tmp_path):
    from neuron_qwen3 import data

    cases = []
    (tmp_path / "empty.jsonl").write_text("")
    cases.append(("empty.jsonl", "text", "{}: is empty (no records)"))
    (tmp_path / "binary.jsonl").write_bytes(b'{"text": "ok"}\n\xff\xfe\x00garbage\n')
    cases.append(("binary.jsonl", "text", "{}:2: not UTF-8 text"))
    (tmp_path / "data.csv").write_text("text\nx\n")
    cases.append(("data.csv", "text", "{}: not a .jsonl, .json, .parquet, .txt file (or a folder of one kind of them)"))
    (tmp_path / "array.json").write_text('[\n  {"text": "a"},\n  {"text": "b"}\n  {"text": "c"}\n]\n')
    cases.append(("array.json", "text", "{}:4: invalid JSON at column 3: Expecting ',' delimiter"))
    (tmp_path / "array2.json").write_text('[\n  {"text": "a"},\n  {"body": "b"}\n]\n')
    cases.append(("array2.json", "text", "{}:3: no field DATASET_FIELD='text' (the record has: body)"))
    write_parquet(tmp_path / "rows.parquet", [GOOD_CHAT, GOOD_CHAT, {"messages": [{"role": "user", "content": "x"}]}])
    cases.append(("rows.parquet", "messages", "{} row 3: no assistant turn: nothing to train on"))
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.jsonl").write_text(json.dumps(GOOD_TEXT) + "\n")
    write_parquet(tmp_path / "mixed" / "b.parquet", [GOOD_TEXT])
    cases.append(("mixed", "text", "{}: holds .jsonl and .parquet files: a folder must hold one kind"))
    (tmp_path / "kinds").mkdir()
    (tmp_path / "kinds" / "a.jsonl").write_text(json.dumps(GOOD_TEXT) + "\n")
    (tmp_path / "kinds" / "b.jsonl").write_text(json.dumps(GOOD_CHAT) + "\n")
    cases.append(("kinds", "text", "{}:1: no field DATASET_FIELD='text' (the record has: messages)"))
    for name, field, what in cases:
        path = tmp_path / name
        shown = path / "b.jsonl" if name == "kinds" else path
        expected = what.format(shown)
        assert data.scan(str(path), field).problem == expected, name
        assert loader_line(path, field) == expected, name


def test_a_clean_scan_counts_what_was_read(tmp_path):
    from neuron_qwen3 import config_registry, data

    path = tmp_path / "chat.jsonl"
    rows = [
        chat(
            {"role": "system", "content": "s"},
            {"role": "user", "content": "q"},
            CALL,
            {"role": "tool", "content": "r"},
            {"role": "assistant", "content": "a"},
        ),
        json.dumps(
            {"messages": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}], "system": "Be nice."}
        ),  # ShareGPT turns (and its system column) under the same field
        json.dumps({"prompt": "2+2?", "completion": "4"}),
    ]
    path.write_text("\n".join(rows) + "\n")
    formats = data.scan(str(path), "messages")
    assert formats.problem is None and formats.counts["records"] == 3 and formats.counts["turns"] == 5 + 3 + 2
    full = data.scan(str(path), "messages", tokenizer_folder=str(config_registry.SMOKE_TOKENIZER))
    assert full.problem is None and full.counts["turns"] == 10
    assert full.counts["tokens_trained"] > 0 and full.counts["tokens_masked"] > full.counts["tokens_trained"]
