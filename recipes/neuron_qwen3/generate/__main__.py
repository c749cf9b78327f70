"""`python -m neuron_qwen3.generate MODEL PROMPTS --out answers.jsonl`: answer a file of prompts with an exported
model folder (EXPORT_DIR's: weights, config.json, tokenizer) or a training checkpoint, through the generator the
samples use.

For looking at a run's result and for evaluation scripts. PROMPTS is in SAMPLE_PROMPTS' forms (conversations in
`messages` or `conversations`, or a `prompt`; `enable_thinking` per record). Each line of the output is one
prompt's answer: its origin (file:line), the prompt's last user text, the answer's text, its tokens, the
log-probability of each token under the model, and why it stopped (`end` or `length`). The plan's shapes and the
time go to stderr. One process, on CPU (float32) or the one GPU (the folder's dtype).

A checkpoint (a `step-N` folder, or CHECKPOINT_DIR's folder of them: its newest complete step) holds neither the
run's settings nor, under LoRA, the base: it is exported first by the launcher itself, run in this environment,
which must be the run's (VARIANT, INIT_FROM, LORA_*, ...). It resumes at that step, trains none and exports the
model (merged under LoRA) to --export-dir, or to a temporary folder removed afterwards.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from neuron_qwen3.data.records import DataError
from neuron_qwen3.generate.engine import Generator
from neuron_qwen3.generate.plan import Plan, buckets_for
from neuron_qwen3.generate.sampling import Sampling
from neuron_qwen3.prelaunch import checkpoints


def arguments(argv):
    parser = argparse.ArgumentParser(prog="python -m neuron_qwen3.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="an exported model folder, or a checkpoint: a step-N folder or a folder of them")
    parser.add_argument("prompts", help="a JSONL/JSON/Parquet file of prompts (SAMPLE_PROMPTS' forms)")
    parser.add_argument("--out", required=True, help="the JSONL file the answers go to")
    parser.add_argument("--tokens", type=int, default=256, help="the most new tokens an answer takes")
    parser.add_argument("--slots", type=int, default=8, help="prompts answered at once")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0, help="the draws' seed (sampling only)")
    parser.add_argument(
        "--export-dir", help="where a checkpoint's export goes, and stays (default: a temporary folder, removed)"
    )
    return parser.parse_args(argv)


def checkpoint_in(folder: Path) -> tuple[Path, int] | None:
    """(the checkpoint folder, the step) that `folder` names: a step-N folder, or the folder of them (its newest
    complete one, as the launcher would resume)."""
    match = checkpoints.STEP.fullmatch(folder.name)
    if match:
        why = checkpoints.problem(folder)
        if why:
            raise DataError(f"{folder}: not a complete checkpoint: {why}")
        return folder.parent, int(match[1])
    latest = checkpoints.scan(folder).latest
    return None if latest is None else (folder, latest)


def export_checkpoint(folder: Path, step: int, export: Path, work: Path) -> None:
    """The launcher, in this environment, resumed from step `step` of `folder`: it trains no step and writes the
    model folder to `export` (its logs and report to `work`)."""
    env = dict(
        os.environ,
        CHECKPOINT_DIR=str(folder),
        STEPS=str(step),
        EXPORT_DIR=str(export),
        EXPORT_MERGED="1",
        OUTPUT_DIR=str(work),
        SAMPLE_PROMPTS="",
    )
    env.pop("EPOCHS", None)  # STEPS says where the export is; EPOCHS would derive the steps from the data
    print(
        f"neuron_qwen3.generate: {folder}/step-{step} is a checkpoint: exporting it to {export} with the launcher "
        f"(this environment's settings, STEPS={step})",
        file=sys.stderr,
    )
    # the launcher's own arguments come last, after EXTRA_ARGS: this step, not the newest
    launch = [sys.executable, "-m", "entrypoint", f"--checkpoint.load_step={step}"]
    launched = subprocess.run(launch, env=env, stdout=sys.stderr)
    if launched.returncode != 0:
        raise DataError(
            f"{folder}/step-{step}: the launcher's export of the checkpoint failed (exit {launched.returncode}, its "
            "output above): run this command in the environment of the run that saved it"
        )


def main(argv=None) -> int:
    args = arguments(argv)
    try:
        return answer(args)
    except (DataError, ValueError, OSError) as error:
        print(f"neuron_qwen3.generate: {error}", file=sys.stderr)
        return 2


def answer(args) -> int:
    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.min_p)
    if args.tokens < 1 or args.slots < 1:
        raise ValueError(f"--tokens {args.tokens} and --slots {args.slots} must be positive")
    if not os.path.isfile(args.prompts):
        raise DataError(f"{args.prompts}: no such file")
    folder = Path(args.model)
    if (folder / "config.json").is_file():
        return answer_with(folder, sampling, args)
    if (folder / "adapter_config.json").is_file():
        raise DataError(
            f"{folder}: a PEFT adapter folder, not a model folder: export the run with EXPORT_MERGED=1 for a merged "
            "model, or give its checkpoint"
        )
    found = checkpoint_in(folder)
    if found is None:
        raise DataError(f"{folder}: neither an exported model folder (no config.json) nor a checkpoint (no step-N)")
    with tempfile.TemporaryDirectory(prefix="neuron-qwen3-generate-") as work:
        export = Path(args.export_dir) if args.export_dir else Path(work) / "model"
        export_checkpoint(*found, export, Path(work) / "run")
        return answer_with(export, sampling, args)


def answer_with(folder: Path, sampling: Sampling, args) -> int:
    import transformers
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3.data.prompts import read_prompts
    from neuron_qwen3.generate import setup as generator_setup

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32 if device == "cpu" else "auto"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(folder))
    room = model.config.max_position_embeddings - args.tokens
    prompts = read_prompts(args.prompts, "messages", tokenizer, room)
    plan = Plan(min(args.slots, len(prompts)), buckets_for([len(p.ids) for p in prompts], room), args.tokens)
    for phase, shape in plan.shapes():
        print(f"neuron_qwen3.generate: {phase} shape {list(shape)}", file=sys.stderr)
    generator = Generator(model, plan, generator_setup.stop_ids(tokenizer))
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
