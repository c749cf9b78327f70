"""A record as text or as a conversation: OpenAI `messages`, ShareGPT `conversations`, prompt/completion.

Every conversation comes out as OpenAI-style messages (role, content; an assistant's `tool_calls` and
`reasoning_content`) plus the record's `tools`, which is what chat templates take. A record that does not fit
raises `Problem` with what is wrong; the caller adds where the record is.
"""

import json

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "human": "user",
    "gpt": "assistant",
    "system": "system",
    "function_call": "assistant",
    "observation": "tool",
}


class Problem(ValueError):
    """What is wrong with one record (without where it is)."""


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def kind(record: dict, field: str) -> str:
    """'text', 'chat', 'pair' (a preference pair: chosen and rejected, data/pairs.py) or 'prompt' (a prompt alone,
    TRL's prompt-only record, which METHOD=grpo answers), from one record."""
    if "chosen" in record and "rejected" in record:
        return "pair"
    value = record.get(field)
    if isinstance(value, str):
        return "text"
    if isinstance(value, list) or (value is None and "prompt" in record and "completion" in record):
        return "chat"
    if value is None and "prompt" in record:
        return "prompt"
    if field not in record:
        raise Problem(f"no field DATASET_FIELD={field!r} (the record has: {', '.join(sorted(record)) or 'none'})")
    raise Problem(f"DATASET_FIELD={field!r} is neither a string (text) nor a list of messages: {_short(value)}")


def text(record: dict, field: str) -> str:
    value = record.get(field)
    if field not in record:
        raise Problem(f"no field DATASET_FIELD={field!r} (the record has: {', '.join(sorted(record)) or 'none'})")
    if not isinstance(value, str):
        raise Problem(f"DATASET_FIELD={field!r} is not a string: {_short(value)}")
    return value


def conversation(record: dict, field: str, answered: bool = True) -> tuple[list, list | None]:
    """(messages, tools) of a chat record, checked; `answered=False`: a prompt to answer, which needs no assistant
    turn (a `prompt` record needs no `completion`)."""
    value, system = record.get(field), None
    if value is None and "prompt" in record and ("completion" in record or not answered):
        messages = _prompt_completion(record)
    elif not isinstance(value, list):
        kind(record, field)  # names what the field is instead
        raise Problem(f"DATASET_FIELD={field!r} is not a list of messages: {_short(value)}")
    elif not value:
        raise Problem(f"DATASET_FIELD={field!r} is an empty list")
    elif isinstance(value[0], dict) and "from" in value[0]:
        messages = [_sharegpt(k, m) for k, m in enumerate(value, 1)]
        if isinstance(record.get("system"), str) and messages[0]["role"] != "system":
            system = {"role": "system", "content": record["system"]}  # LLaMA-Factory's system column
    else:
        messages = [_openai(k, m) for k, m in enumerate(value, 1)]
    _check_turns(messages, answered)
    return ([system] if system else []) + messages, _tools(record.get("tools"))


def prompt(record: dict) -> tuple[str | None, list | None, list | None]:
    """TRL's prompt-only record (METHOD=grpo): (text, None, None) for a standard prompt, raw text no chat template
    wraps, as TRL tokenizes it; (None, messages, tools) for a conversational one, a list of messages to answer."""
    value = record["prompt"]
    if isinstance(value, str):
        return value, None, None
    if not isinstance(value, list):
        raise Problem(f"prompt is neither a string nor a list of messages: {_short(value)}")
    messages, tools = conversation({"messages": value, "tools": record.get("tools")}, "messages", answered=False)
    return None, messages, tools


def thinking_of(record: dict) -> bool | None:
    """A record's `enable_thinking` for Qwen3's chat template: true, false, or None (absent: the template's own)."""
    thinking = record.get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise Problem(f"enable_thinking is not true or false: {thinking!r}")
    return thinking


def _prompt_completion(record: dict) -> list:
    names = [name for name in ("prompt", "completion") if name in record]
    for name in names:
        if not isinstance(record[name], str):
            raise Problem(f"{name} is not a string: {_short(record[name])}")
    roles = {"prompt": "user", "completion": "assistant"}
    return [{"role": roles[name], "content": record[name]} for name in names]


def _openai(k: int, message) -> dict:
    if not isinstance(message, dict):
        raise Problem(f"message {k} is not an object: {_short(message)}")
    role = message.get("role")
    if role not in ROLES:
        raise Problem(f"message {k}: unknown role {_short(role)} (allowed: {', '.join(ROLES)})")
    out = {"role": role, "content": message.get("content")}
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            raise Problem(f"message {k} ({role}) has tool_calls: only assistant turns call tools")
        out["tool_calls"] = [_tool_call(k, call) for call in _list(k, "tool_calls", calls)]
    if out["content"] is None and out.get("tool_calls"):
        out["content"] = ""  # OpenAI writes null content beside tool calls
    if not isinstance(out["content"], str):
        raise Problem(f"message {k} ({role}): content is not a string: {_short(out['content'])}")
    reasoning = message.get("reasoning_content")
    if reasoning is not None:
        if role != "assistant" or not isinstance(reasoning, str):
            raise Problem(f"message {k} ({role}): reasoning_content must be a string on an assistant turn")
        out["reasoning_content"] = reasoning
    for name in ("name", "tool_call_id"):
        if isinstance(message.get(name), str):
            out[name] = message[name]
    return out


def _list(k: int, name: str, value) -> list:
    if not isinstance(value, list):
        raise Problem(f"message {k}: {name} is not a list: {_short(value)}")
    return value


def _tool_call(k: int, call) -> dict:
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise Problem(f"message {k}: a tool call needs a function name: {_short(call)}")
    arguments = function.get("arguments", {})
    if not isinstance(arguments, (str, dict)):
        raise Problem(f"message {k}: tool call {function['name']!r} arguments are not an object or a JSON string")
    return {"type": "function", "function": {"name": function["name"], "arguments": arguments}}


def _sharegpt(k: int, message) -> dict:
    if not isinstance(message, dict):
        raise Problem(f"message {k} is not an object: {_short(message)}")
    source, value = message.get("from"), message.get("value")
    if source not in SHAREGPT_ROLES:
        raise Problem(f"message {k}: unknown role from={_short(source)} (allowed: {', '.join(SHAREGPT_ROLES)})")
    if not isinstance(value, str):
        raise Problem(f"message {k} ({source}): value is not a string: {_short(value)}")
    if source != "function_call":
        return {"role": SHAREGPT_ROLES[source], "content": value}
    try:
        calls = json.loads(value)
    except json.JSONDecodeError:
        raise Problem(f"message {k} (function_call): value is not JSON: {_short(value)}") from None
    calls = calls if isinstance(calls, list) else [calls]
    return {"role": "assistant", "content": "", "tool_calls": [_tool_call(k, call) for call in calls]}


def _check_turns(messages: list, answered: bool) -> None:
    if answered and not any(m["role"] == "assistant" for m in messages):
        raise Problem("no assistant turn: nothing to train on")
    caller = None  # the message a tool result answers: the nearest earlier one that is not a tool result
    for k, message in enumerate(messages, 1):
        if message["role"] != "tool":
            caller = message
        elif caller is None or not caller.get("tool_calls"):
            raise Problem(f"message {k}: a tool result without a preceding assistant tool call")


def _tools(tools) -> list | None:
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
            raise Problem(f"tools is not JSON: {_short(tools)}") from None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise Problem(f"tools is not a list of objects: {_short(tools)}")
    return tools or None
