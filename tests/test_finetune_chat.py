"""Fine-tuning on conversations through the launcher (smoke scale, CPU): the variants agree, SFT learns the
template, a bad record stops the worker with its one line.

- v5 = native: from one random Qwen3ForCausalLM that transformers saved, both variants trained through
  `python -m entrypoint` on the same multi-turn conversations (system, tool calls and results, thinking) give the
  same loss at every step, within fp32 noise, over several optimizer steps. With the v5 backend's old plain
  causal mask they do not (checked by hand when the block-causal mask came in).
- SFT on 2 processes: the loss falls, and transformers serves the export: its loss on the training conversations
  is the trained one, and it answers a new question in a well-formed turn that ends with <|im_end|>; the samples
  the run took of those questions end so at the last step, and did not at step 0.
- every kind of bad record: the pre-launch pass names it in one line and starts nothing (exit 2); with
  PREFLIGHT=warn it reaches the worker, which prints the same line, exits 2 (torchrun's failure table says so,
  with that line and no traceback; torchrun itself exits 1), and no step runs.
Run: .venv/bin/python -m pytest tests/test_finetune_chat.py -q
"""

import functools
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import ANSI, RECIPES, REPO, STEP_LOSS, worker_env

pytestmark = pytest.mark.training
QUESTIONS = ("3+9?", "12+30?")  # not in the training conversations
AGREE = 1e-5  # relative, per step; measured below 1e-6, and 1e-3 with the old causal mask
FP32 = "--training.mixed_precision_param float32"  # FSDP computes in bf16 by default: its noise would be 1e-5


def losses(result) -> dict:
    return {int(s): float(v) for s, v in STEP_LOSS.findall(ANSI.sub("", result.stdout + result.stderr))}


def sums(i):
    a, b = i % 10, (3 * i) % 10
    return a, b, a + b


def conversations(count):
    """Arithmetic in turn as one turn (with a system turn every other time), a tool call and its result, and
    two turns with reasoning: short enough that several share a window, so a leaking mask would show."""
    rows = []
    for i in range(count):
        a, b, c = sums(i)
        if i % 3 == 0:
            messages = [{"role": "system", "content": "Add."}] if i % 2 else []
            messages += [{"role": "user", "content": f"{a}+{b}?"}, {"role": "assistant", "content": f"{c}."}]
        elif i % 3 == 1:
            call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
            messages = [
                {"role": "user", "content": f"{a}+{b}?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": str(c)},
                {"role": "assistant", "content": f"{c}."},
            ]
        else:
            messages = [
                {"role": "user", "content": f"{a}+{b}?"},
                {"role": "assistant", "content": f"{c}."},
                {"role": "user", "content": f"{b}+{a}?"},
                {"role": "assistant", "content": f"{c}.", "reasoning_content": "Same sum."},
            ]
        rows.append({"messages": messages})
    return rows


def write_jsonl(path, rows):
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return str(path)


def save_dense(folder):
    import transformers

    from neuron_qwen3 import config_registry

    shape = json.loads((config_registry.HF_MODEL["smoke"] / "config.json").read_text())
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**shape)).save_pretrained(folder)
    return str(folder)


def launch(tmp, name, **env):
    env = worker_env(SCALE="smoke", OUTPUT_DIR=f"{tmp}/{name}-out", CACHE_DIR=f"{tmp}/cache", **env)
    return subprocess.run(
        [sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
    )


@functools.cache
def source_and_data(tmp):
    return save_dense(f"{tmp}/source"), write_jsonl(f"{tmp}/chat.jsonl", conversations(200))


@functools.cache
def run(tmp, name):
    """One launcher run, each at most once per session: native and v5 from one model, sft on 2 processes."""
    source, chat = source_and_data(tmp)
    if name == "sft":
        prompts = write_jsonl(
            f"{tmp}/prompts.jsonl",
            [{"messages": [{"role": "user", "content": question}], "enable_thinking": False} for question in QUESTIONS],
        )
        return launch(
            tmp,
            name,
            VARIANT="native",
            DATASET=chat,
            DATASET_FIELD="messages",
            STEPS="40",
            NPROC="2",
            LR="3e-3",
            EXPORT_DIR=f"{tmp}/export",
            EXPORT_DTYPE="float32",
            SAMPLE_PROMPTS=prompts,
            SAMPLE_TOKENS="16",
        )
    return launch(
        tmp, name, VARIANT=name, INIT_FROM=source, DATASET=chat, DATASET_FIELD="messages", STEPS="5", EXTRA_ARGS=FP32
    )


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return str(tmp_path_factory.mktemp("chat"))


def finished(result, steps):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = losses(result)
    assert sorted(found) == list(range(1, steps + 1)), found
    return found


def test_v5_and_native_train_the_same_function(tmp):
    native, v5 = finished(run(tmp, "native"), 5), finished(run(tmp, "v5"), 5)
    for step in native:
        assert abs(v5[step] - native[step]) <= AGREE * native[step], (step, native, v5)
    assert native[5] < native[1]  # several optimizer steps, and they moved the model


def test_sft_on_two_processes_answers_in_the_template(tmp):
    """The loss falls, and transformers serves the export: on the conversations it was trained on, the loss
    transformers computes from the exported folder (the tokens TRAIN_ON=assistant counts) is the trained one, far
    below the first step's; asked a new question, its greedy answer is a well-formed turn: a number and a full stop,
    then the one <|im_end|> token, where generation stops by itself (the export's generation_config.json). Forty
    steps from random init learn the turn's form, not yet the sums."""
    import transformers
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3.data.tokens import IM_END, Encoder

    result = run(tmp, "sft")
    found = finished(result, 40)
    assert "--nproc_per_node=2" in result.stdout
    assert found[40] < found[1] - 1.0, found
    folder = f"{tmp}/export"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    encoder = Encoder(HuggingFaceTokenizer(tokenizer_path=folder))
    total = count = 0.0
    for row in conversations(30):
        doc = encoder.chat(row["messages"])
        with torch.no_grad():
            logits = model(torch.tensor([doc.ids[:-1]])).logits[0]
        labels = torch.tensor(doc.labels)
        total += torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum").item()
        count += (labels != -100).sum().item()
    served = total / count
    assert served < found[1] - 1.0 and abs(served - found[40]) < 0.5, (served, found)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    end_of_turn = tokenizer.convert_tokens_to_ids(IM_END)
    assert end_of_turn in model.generation_config.eos_token_id
    for question in QUESTIONS:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, enable_thinking=False, tokenize=False
        )
        assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        answer = model.generate(**ids, max_new_tokens=16, do_sample=False)[0, ids["input_ids"].shape[1] :].tolist()
        assert answer[-1] == end_of_turn and end_of_turn not in answer[:-1], tokenizer.decode(answer)
        assert re.fullmatch(r"\d+\.", tokenizer.decode(answer[:-1])), tokenizer.decode(answer)


def test_the_samples_learn_to_end_the_turn(tmp):
    """The same fine-tune answering QUESTIONS while it trains (SAMPLE_PROMPTS, report/samples.jsonl): the random
    model's answers at step 0 are others; at step 40 each ends with the <|im_end|> token."""
    from neuron_qwen3.data.tokens import IM_END

    finished(run(tmp, "sft"), 40)
    rows = [json.loads(line) for line in open(f"{tmp}/sft-out/report/samples.jsonl")]
    first, last = ([row for row in rows if row["step"] == step] for step in (0, 40))
    assert [row["text"] for row in last] == list(QUESTIONS) and len(rows) == 2 * len(QUESTIONS)
    end_of_turn = json.load(open(f"{tmp}/export/tokenizer.json"))["added_tokens"]
    end_of_turn = next(token["id"] for token in end_of_turn if token["content"] == IM_END)
    assert all(row["stop"] == "end" and row["tokens"][-1] == end_of_turn for row in last), last
    assert all(row["tokens"] != again["tokens"] for row, again in zip(first, last))


# A tool turn without a call: (third line, DATASET_FIELD, what the worker's line says after "<file>:3: ")
BAD = (
    json.dumps(
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "tool", "content": "b"},
                {"role": "assistant", "content": "c"},
            ]
        }
    ),
    "messages",
    "message 2: a tool result without a preceding assistant tool call",
)


# Every kind's line (a text record, a conversation, a file, a folder), from the pre-launch scan and from a worker's
# DataLoader, is test_data_records.py's, in process. This run proves the one path from there to the user, the same
# for every kind: the launcher's one line before launch, and past it (PREFLIGHT=warn) the worker's exit 2 and
# torchrun's table.
def test_a_bad_record_stops_the_worker_with_its_line(tmp_path):
    bad, field, what = BAD
    good = json.dumps(conversations(1)[0])
    dataset = tmp_path / "data.jsonl"
    dataset.write_text(f"{good}\n{good}\n{bad}\n")
    line = f"{dataset}:3: {what}"
    before = launch(tmp_path, "check", VARIANT="native", DATASET=str(dataset), DATASET_FIELD=field, STEPS="2")
    assert before.returncode == 2 and "torch.distributed.run" not in before.stdout, before.stdout + before.stderr
    assert f"entrypoint: DATASET: {line}" in before.stderr.splitlines(), before.stderr
    result = launch(
        tmp_path, "bad", VARIANT="native", DATASET=str(dataset), DATASET_FIELD=field, STEPS="2", PREFLIGHT="warn"
    )
    output = ANSI.sub("", result.stdout + result.stderr)
    assert result.returncode != 0
    worker = [text for text in output.splitlines() if text.startswith("[rank0]:") and text.endswith(line)]
    assert worker == [f"[rank0]:neuron_qwen3: {line}"], output
    assert "exitcode  : 2" in output and f"traceback : neuron_qwen3: {line}" in output  # torchrun's failure table
    assert not losses(result)
    assert f'File "{RECIPES}' not in output and f'File "{os.path.realpath(RECIPES)}' not in output  # no traceback
