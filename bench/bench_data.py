"""The data path's speed per CPU core, beside what one trn2 rank trains per second.

    .venv/bin/python -m bench.bench_data               # ~1 min
    .venv/bin/python -m bench.bench_data --records 500

Qwen's real-size tokenizer (tests/qwen_size.py: 151,643 BPE ranks + Qwen3's special tokens and the Qwen3-style
chat template), synthetic records of realistic length (multi-turn conversations with system turns, tool calls
and results, reasoning; text documents), read from a .jsonl by neuron_qwen3.data.DataLoader itself: JSON, the
chat template's rendering, tokenization, the loss mask, fitting and packing into seq_len windows. Speed is
tokens per second of process CPU time in one thread (one core), so other load on the machine barely moves it.
The yardstick: one trn2 rank (a logical NeuronCore, LNC=2: two physical cores of 79 TFLOPS bf16, AWS's
figure) training Qwen3-4B at 40 % MFU at sequence 4096, FLOPs per token as the run report counts them.
The goal is at least 10x that per core.
"""

import argparse
import json
import os
import random
import tempfile
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread: the figure is per core

import torch  # noqa: E402

from neuron_qwen3 import shapes  # noqa: E402

from neuron_qwen3.report import flops
from tests import qwen_size  # noqa: E402

PHYSICAL_CORE_FLOPS, LNC, MFU, SEQ_LEN = 79e12, 2, 0.40, 4096
WORDS = (
    "the model reads each token and the kernel moves data between the cores while the compiler plans "
    "every tensor so training stays fast on a large cluster of chips with careful memory use and a "
    "router that sends tokens to experts in sparse dense layers quiet bright patient garden river city "
    "Paris Tōkyō 東京 naïve café 42 3.14 1024"
).split()


def rank_tokens_per_s() -> float:
    return MFU * PHYSICAL_CORE_FLOPS * LNC / flops.per_token(shapes.FLAVORS["4B"], SEQ_LEN)


def words(rng, low, high):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(low, high)))


def conversation(rng):
    messages = [{"role": "system", "content": words(rng, 10, 40)}] if rng.random() < 0.5 else []
    for _turn in range(rng.randrange(1, 5)):
        messages.append({"role": "user", "content": words(rng, 20, 200)})
        if rng.random() < 0.3:
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"type": "function", "function": {"name": "lookup", "arguments": {"query": words(rng, 2, 8)}}}
                    ],
                }
            )
            messages.append({"role": "tool", "content": words(rng, 20, 120)})
        reply = {"role": "assistant", "content": words(rng, 30, 400)}
        if rng.random() < 0.5:
            reply["reasoning_content"] = words(rng, 20, 200)
        messages.append(reply)
    return {
        "messages": messages,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
                },
            }
        ],
    }


def measure(path, field, tokenizer, records):
    """(document tokens per CPU-second, windows) of one pass over `path` by the DataLoader, one thread."""
    from neuron_qwen3 import data

    loader = data.DataLoader.Config(source=path, field=field, infinite=False).build(
        dp_world_size=1, dp_rank=0, tokenizer=tokenizer, seq_len=SEQ_LEN, local_batch_size=1
    )
    start = time.process_time()
    windows = sum(1 for _ in loader)
    seconds = time.process_time() - start
    stats = loader.stats()
    assert stats["records"] == records
    return (stats["tokens_trained"] + stats["tokens_masked"]) / seconds, windows, stats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = HuggingFaceTokenizer(tokenizer_path=qwen_size.build(os.path.join(tmp, "tokenizer")))
        chat, text = os.path.join(tmp, "chat.jsonl"), os.path.join(tmp, "text.jsonl")
        with open(chat, "w") as f:
            f.writelines(json.dumps(conversation(rng)) + "\n" for _ in range(args.records))
        with open(text, "w") as f:
            f.writelines(json.dumps({"text": words(rng, 200, 2000)}) + "\n" for _ in range(args.records))
        rank = rank_tokens_per_s()
        print(
            f"one trn2 rank, Qwen3-4B at {MFU:.0%} MFU, sequence {SEQ_LEN}: {rank:,.0f} tokens/s "
            f"({LNC} x {PHYSICAL_CORE_FLOPS / 1e12:g} TFLOPS)"
        )
        print(f"{'data path, one core':<62} {'tokens/s':>10} {'x rank':>8}")
        for name, path, field in (
            ("conversations: JSON, template, tokens, mask, fit, pack", chat, "messages"),
            ("text: JSON, tokens, pack", text, "text"),
        ):
            speed, windows, stats = measure(path, field, tokenizer, args.records)
            per_record = (stats["tokens_trained"] + stats["tokens_masked"]) / stats["records"]
            print(
                f"{name:<62} {speed:>10,.0f} {speed / rank:>7.0f}x   ({args.records} records, "
                f"{per_record:,.0f} tokens each, {windows} windows)"
            )


if __name__ == "__main__":
    main()
