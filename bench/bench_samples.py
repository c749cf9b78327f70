"""What a round of generation samples costs against the training time of a validation interval (report/samples.py).

    .venv/bin/python -m bench.bench_samples                    # smoke and bench_cpu, native, 1 rank: ~6 min here
    .venv/bin/python -m bench.bench_samples --scales smoke     # the smoke model alone, ~1 min

Each run is the launcher's (`python -m entrypoint`), VARIANT=native with the bundled prompts (three: one wave of the
generator), SAMPLE_TOKENS=--tokens and SAMPLE_INTERVAL=2, so the samples at steps 0, 2, 4, ... and after the last
alternate with training steps in one run. From its summary.json: the seconds per round (samples.seconds over the
rounds, one prefill each); from its metrics.jsonl, the median training step after the first (which warms up). The
steps right after a round and the others are printed apart too: a round is moved out of the next step's time
(report/samples.py), so the two should agree. The share printed is a round against torchtitan's default validation
interval of 10 training steps, validation itself left out (so an upper bound).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_INTERVAL = 10
SAMPLE_INTERVAL = 2


def run(scale: str, steps: int, tokens: int, tmp: str) -> dict:
    out = os.path.join(tmp, scale)
    env = dict(
        os.environ,
        VARIANT="native",
        SCALE=scale,
        STEPS=str(steps),
        SAMPLE_TOKENS=str(tokens),
        SAMPLE_INTERVAL=str(SAMPLE_INTERVAL),
        SAMPLE_PROMPTS=os.path.join(REPO, "recipes", "neuron_qwen3", "assets", "samples.jsonl"),
        OUTPUT_DIR=out,
        CACHE_DIR=os.path.join(tmp, "cache"),
        DEVICE="cpu",
        PYTHONPATH=os.pathsep.join([os.path.join(REPO, "recipes"), REPO]),
    )
    result = subprocess.run([sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    with open(os.path.join(out, "report", "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(out, "report", "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    timed = [r for r in records if "step_time_s" in r and r["step"] > 1]  # step 1 warms up
    after = [r["step_time_s"] for r in timed if (r["step"] - 1) % SAMPLE_INTERVAL == 0]  # a round ran before it
    others = [r["step_time_s"] for r in timed if (r["step"] - 1) % SAMPLE_INTERVAL]
    assert after and others, "too few steps to compare the steps after a round with the others: raise --steps"
    return summary, statistics.median(after + others), statistics.median(after), statistics.median(others)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scales", nargs="+", default=["smoke", "bench"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=48, help="SAMPLE_TOKENS of the measured runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for scale in args.scales:
            summary, step, after, others = run(scale, args.steps, args.tokens, tmp)
            samples = summary["samples"]
            rounds = sum(n for phase, _, n in samples["forwards"] if phase == "prefill")
            per_round = samples["seconds"] / rounds
            share = per_round / (DEFAULT_INTERVAL * step)
            print(
                f"{scale}: shapes {samples['shapes']}, {summary['steps']['done']} steps, {rounds} rounds of "
                f"{args.tokens} tokens in {samples['seconds']:.2f} s: {per_round:.2f} s a round against a "
                f"{step:.2f} s training step; a round every {DEFAULT_INTERVAL} steps: {share:.1%} of the interval"
                f" (median step after a round {after:.3f} s, after none {others:.3f} s)"
            )


if __name__ == "__main__":
    main()
