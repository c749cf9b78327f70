"""A GRPO step against TRL's GRPOTrainer with use_vllm=False, on the same model, prompts, generations and
completion length: step time, and the share of it spent generating, side by side.

    flock /tmp/neuron-qwen3-heavy.lock .venv/bin/python -m bench.bench_grpo            # CPU: ~15 min

One random base of the bench shape (CPU: the 0.2B bench_cpu one), float32, 1 rank. Each step: 2 prompts x 8
generations of exactly --tokens tokens (a random model never says its stop token, and both sides stop at
--tokens), temperature 1, micro-batches of 8 completions, 2 micro-steps. Ours runs through the launcher
(METHOD=grpo, SEQ_LEN = the prompt room + --tokens); TRL's GRPOTrainer (its defaults but these) runs in a fresh
interpreter, with transformers' `generate` for the rollouts. They alternate for --repeats rounds. Per run: the median
step time after the first two steps, and the median seconds generating per step (ours: the run report's
grpo/time/generate_s; TRL's: its `_generate`, timed). Printed: both, and ours over TRL's (median and range over
the rounds). Activation checkpointing is each side's default (torchtitan's selective, TRL's full), or off on both
with --no-checkpointing.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

from bench.bench_dpo import sentence
from bench.bench_lora import CHECKOUT, REPO, WARMUP, base_model

GENERATIONS, PER_STEP, MICRO_BATCH = 8, 16, 8
REWARD = "def reward(completions, **kwargs):\n    return [float(len(set(str(c).split())) % 2) for c in completions]\n"


def write_prompts(root: str, count: int) -> str:
    rng = random.Random(0)
    path = os.path.join(root, "prompts.jsonl")
    with open(path, "w") as f:
        for _ in range(count):
            f.write(json.dumps({"prompt": [{"role": "user", "content": sentence(rng, 12)}]}) + "\n")
    with open(os.path.join(root, "bench_reward.py"), "w") as f:
        f.write(REWARD)
    return path


def ours(base: str, prompts: str, args, out: str) -> dict:
    env = {
        **os.environ,
        **CHECKOUT,
        "VARIANT": "native",
        "SCALE": "bench",
        "OUTPUT_DIR": out,
        "SAMPLE_PROMPTS": "",
        "INIT_FROM": base,
        "METHOD": "grpo",
        "DATASET": prompts,
        "GRPO_REWARDS": "bench_reward:reward",
        "GRPO_GENERATIONS": str(GENERATIONS),
        "GRPO_MAX_COMPLETION": str(args.tokens),
        "SEQ_LEN": str(args.room + args.tokens),
        "BATCH_SIZE": str(PER_STEP),
        "STEPS": str(args.steps),
        "LR": "1e-6",
        "WARMUP_STEPS": "0",
        "EXTRA_ARGS": f"--training.mixed_precision_param float32 --training.local_batch_size {MICRO_BATCH}"
        + ("" if args.checkpointing else " activation_checkpoint:none"),
    }
    result = subprocess.run([sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"ours failed ({result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}")
    records = [json.loads(line) for line in open(os.path.join(out, "report", "metrics.jsonl")) if '"loss"' in line]
    late = records[WARMUP:]
    return {
        "step_s": statistics.median(r["step_time_s"] for r in late),
        "generate_s": statistics.median(r["grpo"]["time/generate_s"] for r in late),
        "tokens": statistics.median(r["grpo"]["completions/mean_length"] for r in late),
    }


TRL_SIDE = """
import json, statistics, sys, time
import datasets, torch, transformers
from trl import GRPOConfig, GRPOTrainer
from bench_reward import reward  # the prompts' folder is on the child's PYTHONPATH

base, prompts, _, tokenizer, tokens, steps, out = sys.argv[1:8]
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
data = datasets.Dataset.from_list([json.loads(line) for line in open(prompts)])
config = GRPOConfig(
    output_dir=out, use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1,
    per_device_train_batch_size={micro}, gradient_accumulation_steps={accumulation}, num_generations={generations},
    max_completion_length=int(tokens), temperature=1.0, learning_rate=1e-6, max_steps=int(steps), seed=0,
    dataloader_num_workers=0, gradient_checkpointing={checkpointing},
)
trainer = GRPOTrainer(
    model=model, reward_funcs=[reward], args=config, train_dataset=data,
    processing_class=transformers.AutoTokenizer.from_pretrained(tokenizer),
)
times, generating, lengths = [], [], []
generate = trainer._generate
def timed(*args, **kwargs):
    began = time.perf_counter()
    found = generate(*args, **kwargs)
    generating.append(time.perf_counter() - began)
    return found
trainer._generate = timed

class Clock(transformers.TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        self.began = time.perf_counter()
    def on_step_end(self, args, state, control, **kwargs):
        times.append(time.perf_counter() - self.began)
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "completions/mean_length" in logs:
            lengths.append(logs["completions/mean_length"])

trainer.add_callback(Clock())
trainer.train()
print(json.dumps({{
    "step_s": statistics.median(times[{warmup}:]),
    "generate_s": statistics.median(generating[{warmup}:]),
    "tokens": statistics.median(lengths[{warmup}:]),
}}))
"""


def trl(base: str, prompts: str, tokenizer: str, args, out: str) -> dict:
    code = TRL_SIDE.format(
        micro=MICRO_BATCH,
        accumulation=PER_STEP // MICRO_BATCH,
        generations=GENERATIONS,
        warmup=WARMUP,
        checkpointing=args.checkpointing,
    )
    folder = os.path.dirname(prompts)
    argv = [base, prompts, folder, tokenizer, str(args.tokens), str(args.steps), out]
    path = os.pathsep.join((folder, CHECKOUT["PYTHONPATH"]))
    result = subprocess.run(
        [sys.executable, "-c", code, *argv], env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True
    )
    if result.returncode:
        sys.exit(f"TRL failed ({result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--tokens", type=int, default=64, help="completion tokens (GRPO_MAX_COMPLETION)")
    cli.add_argument("--room", type=int, default=96, help="prompt tokens the window leaves beside the completion")
    cli.add_argument("--steps", type=int, default=6)
    cli.add_argument("--repeats", type=int, default=3)
    cli.add_argument(
        "--no-checkpointing",
        dest="checkpointing",
        action="store_false",
        help="neither side recomputes activations (default: each side's own, torchtitan's selective and TRL's full)",
    )
    cli.add_argument("--dir", default=None, help="where the base and the runs go (default: a temporary folder)")
    args = cli.parse_args()
    from neuron_qwen3 import config_registry  # the editable install's, as every bench imports it

    tokenizer = str(config_registry.SMOKE_TOKENIZER)
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        base = os.path.join(root, "base")
        base_model("native", base)
        prompts = write_prompts(root, 64)
        rows = {"ours": [], "trl": []}
        for i in range(args.repeats):
            rows["ours"].append(ours(base, prompts, args, os.path.join(root, f"ours-{i}")))
            rows["trl"].append(trl(base, prompts, tokenizer, args, os.path.join(root, f"trl-{i}")))
    print(
        f"native SCALE=bench (CPU: bench_cpu), float32, 1 rank; a step: 2 prompts x {GENERATIONS} generations of "
        f"{args.tokens} tokens, micro-batches of {MICRO_BATCH}; {args.steps} steps x {args.repeats} rounds; "
        f"activation checkpointing {'each side its default' if args.checkpointing else 'off on both sides'}"
    )
    print(f"{'side':<6}{'step s':>9}{'generate s':>12}{'share':>8}{'tokens':>8}")
    for name, measured in rows.items():
        step = statistics.median(r["step_s"] for r in measured)
        generate = statistics.median(r["generate_s"] for r in measured)
        tokens = statistics.median(r["tokens"] for r in measured)
        print(f"{name:<6}{step:>9.2f}{generate:>12.2f}{generate / step:>8.0%}{tokens:>8.1f}")
    ratios = [o["step_s"] / t["step_s"] for o, t in zip(rows["ours"], rows["trl"])]
    print(f"ours / TRL step time: {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
