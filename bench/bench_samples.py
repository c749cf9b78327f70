"""What generation samples cost (report/samples.py): one sampling forward pass against one training step.

    .venv/bin/python -m bench.bench_samples                    # smoke and bench_cpu, native, 1 rank: ~6 min here
    .venv/bin/python -m bench.bench_samples --scales smoke     # the smoke model alone, ~1 min

Each run is the launcher's (`python -m entrypoint`), VARIANT=native with the bundled prompts (three, which pack into
one window row), SAMPLE_TOKENS=--tokens and SAMPLE_INTERVAL=2, so the samples at steps 0, 2, 4, ... and after the
last alternate with training steps in one run. From its summary.json: the seconds per sampling forward pass
(samples.seconds / samples.forwards) and the median training step (step_time_s). A round of answers takes at most
SAMPLE_TOKENS forward passes per window; the share printed is what a round of the default 48 tokens costs against
one validation interval of torchtitan's default 10 training steps, validation itself left out (so an upper bound).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TOKENS, DEFAULT_INTERVAL = 48, 10


def run(scale: str, steps: int, tokens: int, tmp: str) -> dict:
    out = os.path.join(tmp, scale)
    env = dict(
        os.environ,
        VARIANT="native",
        SCALE=scale,
        STEPS=str(steps),
        SAMPLE_TOKENS=str(tokens),
        SAMPLE_INTERVAL="2",
        SAMPLE_PROMPTS=os.path.join(REPO, "recipes", "neuron_qwen3", "assets", "samples.jsonl"),
        OUTPUT_DIR=out,
        CACHE_DIR=os.path.join(tmp, "cache"),
        DEVICE="cpu",
        PYTHONPATH=os.pathsep.join([os.path.join(REPO, "recipes"), REPO]),
    )
    result = subprocess.run([sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    with open(os.path.join(out, "report", "summary.json")) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scales", nargs="+", default=["smoke", "bench"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=8, help="SAMPLE_TOKENS of the measured runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for scale in args.scales:
            summary = run(scale, args.steps, args.tokens, tmp)
            samples, step = summary["samples"], summary["step_time_s"]
            forward = samples["seconds"] / samples["forwards"]
            window = samples["shapes"][0]
            share = DEFAULT_TOKENS * forward / (DEFAULT_INTERVAL * step)
            print(
                f"{scale}: window {window[0]} x {window[1]}, {summary['steps']['done']} steps, "
                f"{samples['forwards']} sampling forward passes in {samples['seconds']:.2f} s: "
                f"{forward * 1e3:.1f} ms each against a {step * 1e3:.1f} ms training step "
                f"({forward / step:.2f} of a step); a {DEFAULT_TOKENS}-token round every {DEFAULT_INTERVAL} steps: "
                f"{share:.0%} of the interval; the interval that keeps it under 5 %: "
                f"{DEFAULT_TOKENS * forward / (0.05 * step):.0f} steps"
            )


if __name__ == "__main__":
    main()
