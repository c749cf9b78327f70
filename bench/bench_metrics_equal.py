"""Is a refactor a refactor? The same smoke runs at two commits, every loss and metrics.jsonl field compared bitwise.

    .venv/bin/python -m bench.bench_metrics_equal --before REV       # CPU, 2 ranks a run: ~12 min
    .venv/bin/python -m bench.bench_metrics_equal --before REV --keep OUT

REV is checked out in a temporary git worktree; each case runs through the launcher there and in this checkout
(alternating, one at a time), with the same environment, data and seeds. The cases cover every watcher that sums an
interval over the ranks: the three variants (nki_moe's router losses and experts' load, the samples' generator at
step 0 and the end), DPO, GRPO with 1 and 2 iterations (the rollout's rewards, the loss's token means, the
held-out validation). Fields that time a run (seconds, tokens/s, MFU, memory) are left out; every other value of
every metrics.jsonl record must be equal as written (floats by their repr). Exit 1 and the first differences
printed when any is not.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "recipes" / "neuron_qwen3" / "assets" / "corpus" / "train.jsonl"
TIMED = ("time", "tokens_per_s", "mfu", "memory", "tflops")  # a metric whose name holds one of these, or ends in _s,
# measures the clock or the process

REWARDS = """\
def correct(completions, answer, **kwargs):
    return [float(a in c[0]["content"]) for c, a in zip(completions, answer)]


def short(completion_ids, **kwargs):
    return [1.0 / (1 + len(ids)) for ids in completion_ids]
"""


def write_data(root: Path) -> dict:
    """Pairs for DPO, prompts and a reward module for GRPO: {name: path}."""
    pairs, prompts = [], []
    for n in range(64):
        question = [{"role": "user", "content": f"Is {n} even?"}]
        right, wrong = ("Yes.", "No.") if n % 2 == 0 else ("No.", "Yes.")
        pairs.append({"prompt": question, "chosen": [{"role": "assistant", "content": right}],
                      "rejected": [{"role": "assistant", "content": wrong}]})  # fmt: skip
        prompts.append({"prompt": question, "answer": right})
    root.mkdir(parents=True, exist_ok=True)
    for name, rows in (("pairs", pairs), ("prompts", prompts)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (root / "equal_rewards.py").write_text(REWARDS)
    found = {name: str(root / f"{name}.jsonl") for name in ("pairs", "prompts")}
    return found | {"model": base_model(root / "model")}


def base_model(folder: Path) -> str:
    """A random Qwen3 of the smoke shape, saved by transformers: the INIT_FROM under GRPO's LoRA."""
    import torch
    import transformers

    shape = json.loads((REPO / "recipes" / "neuron_qwen3" / "assets" / "hf_qwen3_tiny" / "config.json").read_text())
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**shape)).save_pretrained(folder)
    return str(folder)


def cases(data: dict) -> dict:
    grpo = dict(
        METHOD="grpo",
        DATASET=data["prompts"],
        VALIDATION=data["prompts"],
        GRPO_REWARDS="equal_rewards:correct,equal_rewards:short",
        GRPO_GENERATIONS="4",
        GRPO_MAX_COMPLETION="8",
        BATCH_SIZE="8",
        SEQ_LEN="64",
        GRPO_BETA="0.04",
        SAMPLE_PROMPTS="",  # the held-out validation runs the generator
        INIT_FROM=data["model"],
        LORA_RANK="8",  # the reference: the base with the adapters off
    )
    return {
        "native": dict(VARIANT="native", VALIDATION=str(CORPUS), VALIDATION_INTERVAL="2"),
        "v5": dict(VARIANT="v5"),
        "nki_moe": dict(VARIANT="nki_moe"),
        "dpo": dict(
            VARIANT="native",
            METHOD="dpo",
            DATASET=data["pairs"],
            INIT_FROM=data["model"],
            SEQ_LEN="64",
            SAMPLE_PROMPTS="",
        ),
        "grpo-1": dict(VARIANT="native", **grpo),
        "grpo-2": dict(VARIANT="native", GRPO_ITERATIONS="2", **grpo),
    }


def run(checkout: Path, name: str, env: dict, out: Path, data: Path) -> list:
    """One case through the launcher in `checkout`: its metrics.jsonl records."""
    folder = out / name
    environ = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": os.pathsep.join([str(checkout / "recipes"), str(checkout), str(data)]),
        "SCALE": "smoke",
        "NPROC": "2",
        "STEPS": "4",
        "OUTPUT_DIR": str(folder),
        "CACHE_DIR": str(out / "cache"),
        "HF_HUB_OFFLINE": "1",
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-m", "entrypoint"], cwd=checkout, env=environ, capture_output=True, text=True, timeout=1200
    )
    if done.returncode:
        sys.exit(f"{name} at {checkout}: exit {done.returncode}\n{done.stderr[-3000:]}")
    lines = (folder / "report" / "metrics.jsonl").read_text().splitlines()
    return [untimed(json.loads(line)) for line in lines if line.strip()]


def untimed(record: dict, prefix: str = "") -> dict:
    """The record's fields, nested ones as "outer/inner", less those that time the run."""
    found = {}
    for key, value in record.items():
        name = prefix + key
        if isinstance(value, dict):
            found.update(untimed(value, name + "/"))
        elif not (name.endswith("_s") or any(word in name for word in TIMED)):
            found[name] = value
    return found


def differences(before: list, after: list) -> list:
    """Each field whose value differs, as 'record k: field before -> after'; records added or lost too."""
    found = [f"{len(before)} records before, {len(after)} after"] if len(before) != len(after) else []
    for k, (old, new) in enumerate(zip(before, after)):
        for key in sorted(old.keys() | new.keys()):
            if repr(old.get(key)) != repr(new.get(key)):
                found.append(f"record {k}: {key} {old.get(key)!r} -> {new.get(key)!r}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit to compare this checkout with")
    parser.add_argument("--keep", help="keep the runs' folders here (default: a temporary folder, removed)")
    parser.add_argument("--only", help="comma-separated case names (default: every case)")
    args = parser.parse_args()
    out = Path(args.keep or tempfile.mkdtemp(prefix="metrics-equal-"))
    worktree = out / "before-checkout"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(worktree), args.before], check=True)
    try:
        data = out / "data"
        table = cases(write_data(data))
        names = args.only.split(",") if args.only else list(table)
        unequal = 0
        for name in names:
            before = run(worktree, name, table[name], out / "before", data)
            after = run(REPO, name, table[name], out / "after", data)
            found = differences(before, after)
            fields = len({key for record in after for key in record})
            verdict = "bitwise equal" if not found else f"{len(found)} differences"
            print(f"{name:8} {len(after)} records, {fields} fields: {verdict}", flush=True)
            for line in found[:10]:
                print(f"    {line}")
            unequal += bool(found)
        return 1 if unequal else 0
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], check=False)
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
