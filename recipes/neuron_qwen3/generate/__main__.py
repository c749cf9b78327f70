"""`python -m neuron_qwen3.generate MODEL_DIR PROMPTS --out answers.jsonl`: answer a file of prompts with an
exported model folder (EXPORT_DIR's: weights, config.json, tokenizer), through the generator the samples use.

For looking at a run's result and for evaluation scripts. PROMPTS is in SAMPLE_PROMPTS' forms (conversations in
`messages` or `conversations`, or a `prompt`; `enable_thinking` per record). Each line of the output is one
prompt's answer: its origin (file:line), the prompt's last user text, the answer's text, its tokens, the
log-probability of each token under the model, and why it stopped (`end` or `length`). The plan's shapes and the
time go to stderr. One process, on CPU (float32) or the one GPU (the folder's dtype). A checkpoint is exported
first (the launcher again, STEPS at its step, EXPORT_DIR) and a LoRA run with EXPORT_MERGED=1: each is refused in
one line that says so.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from neuron_qwen3.data.records import DataError
from neuron_qwen3.generate.engine import Generator
from neuron_qwen3.generate.plan import Plan, buckets_for
from neuron_qwen3.generate.sampling import Sampling


def arguments(argv):
    parser = argparse.ArgumentParser(prog="python -m neuron_qwen3.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="an exported model folder")
    parser.add_argument("prompts", help="a JSONL/JSON/Parquet file of prompts (SAMPLE_PROMPTS' forms)")
    parser.add_argument("--out", required=True, help="the JSONL file the answers go to")
    parser.add_argument("--tokens", type=int, default=256, help="the most new tokens an answer takes")
    parser.add_argument("--slots", type=int, default=8, help="prompts answered at once")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0, help="the draws' seed (sampling only)")
    return parser.parse_args(argv)


def not_a_model_folder(folder: Path) -> str:
    """What `folder` is instead of a model folder, and how to get one from it."""
    steps = sorted((int(p.name[5:]), p) for p in folder.glob("step-*") if p.name[5:].isdigit())
    checkpoint = folder if (folder / ".metadata").is_file() else steps[-1][1] if steps else None
    if checkpoint is not None:
        step = checkpoint.name.removeprefix("step-")
        return (
            f"a training checkpoint ({checkpoint.name}), not a model folder: export it first by running the launcher "
            f"again with the run's settings, STEPS={step} and EXPORT_DIR (it resumes there, trains no step, exports)"
        )
    if (folder / "adapter_config.json").is_file():
        return "a PEFT adapter folder, not a model folder: export the run with EXPORT_MERGED=1 for a merged model"
    return "no config.json: not an exported model folder"


def main(argv=None) -> int:
    args = arguments(argv)
    try:
        return answer(args)
    except (DataError, ValueError, OSError) as error:
        print(f"neuron_qwen3.generate: {error}", file=sys.stderr)
        return 2


def answer(args) -> int:
    import transformers
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3.report import samples

    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.min_p)
    if args.tokens < 1 or args.slots < 1:
        raise ValueError(f"--tokens {args.tokens} and --slots {args.slots} must be positive")
    folder = Path(args.model)
    if not (folder / "config.json").is_file():
        raise DataError(f"{folder}: {not_a_model_folder(folder)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32 if device == "cpu" else "auto"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(folder))
    room = model.config.max_position_embeddings - args.tokens
    prompts = samples.read_prompts(args.prompts, "messages", tokenizer, room)
    plan = Plan(min(args.slots, len(prompts)), buckets_for([len(p.ids) for p in prompts], room), args.tokens)
    for phase, shape in plan.shapes():
        print(f"neuron_qwen3.generate: {phase} shape {list(shape)}", file=sys.stderr)
    generator = Generator(model, plan, samples.stop_ids(tokenizer))
    started = time.perf_counter()
    answers = generator.generate([p.ids for p in prompts], sampling, torch.Generator().manual_seed(args.seed))
    seconds = time.perf_counter() - started
    with open(args.out, "w") as f:
        for prompt, completion in zip(prompts, answers):
            row = {
                "prompt": prompt.origin,
                "text": prompt.text,
                "answer": tokenizer.decode(completion.tokens),
                "tokens": completion.tokens,
                "logprobs": completion.logprobs,
                "stop": completion.stop,
            }
            f.write(json.dumps(row) + "\n")
    new = sum(len(c.tokens) for c in answers)
    print(
        f"neuron_qwen3.generate: {len(answers)} answers, {new} tokens in {seconds:.1f} s on {device} -> {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
