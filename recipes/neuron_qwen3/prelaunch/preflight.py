"""`python -m neuron_qwen3.prelaunch.preflight`: the launcher's pre-launch pass, in a child with the real libraries.

The launcher (stdlib only, it never imports torch) writes one JSON request on stdin: the workers' exact torchtitan
arguments and what to do; this process answers one JSON object, the last line of its stdout:

    {"problems": [...], "warnings": [...], "lines": [...], "config": {...} | null, "model": {...} | null}

Each problem and warning is one line; the launcher prints them and, on a problem, starts nothing (exit 2). What is
checked, with the library that reads it:

| check | problem | warning |
|---|---|---|
| versions | torch, torch-neuronx, transformers or torchtitan off image-build.lock, else the locks (read first: versions.py) | a lock is missing |
| flags | a flag the config does not have, a bad value (tyro's parse, as the workers parse them; a section's own check: settings.py) | |
| batch | BATCH_SIZE not a multiple of local batch x data-parallel ranks, degrees that do not fit the ranks | |
| config | MODEL of another family than the variant, or no released Qwen3 | |
| memory | | the sharded weights, gradients and Adam state take over 60 % of a rank's device memory |
| init_from | no model folder, no weights, another architecture or shape than the run trains (DPO_REFERENCE too, and its RoPE); a RoPE not reproduced here (YaRN: finish.py) | a complete checkpoint wins (not with LoRA) |
| lora | no INIT_FROM, a target the model lacks, TP/EP/PP, an adapter INIT_FROM's base or settings, another base | |
| export | export.dir inside the checkpoint folder, less free space than the export needs | |
| dataset | a mix of another form than path:weight,... or of a missing file; a chat template that cannot render the first record (data.render_first); a record of a local source that cannot be trained on: invalid JSON, no field, a bad conversation or pair (data.scan, every record); pairs without METHOD=dpo, prompts alone without grpo, or either method without its data; a GRPO_REWARDS function that does not import; a GRPO prompt too long for the window beside GRPO_MAX_COMPLETION (every prompt tokenized) | |
| validation | no VALIDATION file, a bad record in it, a fraction of a streamed DATASET | |
| samples | a SAMPLE_PROMPTS record that is no conversation to answer, or too long for the window beside SAMPLE_TOKENS (report/samples.py) | |
| epochs | STEPS (`--training.steps`) beside EPOCHS, a streamed DATASET; else the line "N epochs = S steps of B sequences" (data.epochs, also for --dry-run) | |
| checkpoints | a read error other than "not found" | a broken step-N (moved aside on node 0), an unfinished one |

The config is finished as every worker finishes it (finish.py, on the world of `request["ranks"]` and the device
the launcher found), and each line that says what finishing derived is in "lines"; `--dry-run` prints the result.
This module checks the versions and parses the flags; the other checks are prelaunch/stages.py's named stages.
"""

import contextlib
import io
import json
import re
import sys

from neuron_qwen3 import shapes
from neuron_qwen3.prelaunch import versions
from neuron_qwen3.quirks import import_compile

# tyro's line for a section that refused itself (settings.Section, data.DataLoader.Config): the section's own line
SECTION_REFUSED = re.compile(r"Error parsing [A-Za-z_][\w.]*: (.+)")


def tyro_line(text: str) -> str:
    """tyro's error box (its message, and the flags it suggests) as one line."""
    sections = [
        [line.strip() for line in part.splitlines() if line.strip()] for part in re.split(r"\n\s*-{20,}\s*", text)
    ]
    message = " ".join(next((part for part in sections[1:] if part), ["the arguments do not parse"]))
    suggested = [
        line.split()[0]
        for part in sections
        if part and part[0].startswith("Perhaps you meant")
        for line in part[1:]
        if line.startswith("--")
    ]
    return message + (f" (nearest: {', '.join(suggested[:3])})" if suggested else "")


def _parse(args: list):
    """(config, None), or (None, tyro's error box)."""
    from torchtitan.config import ConfigManager

    noise = io.StringIO()
    try:
        with contextlib.redirect_stderr(noise), contextlib.redirect_stdout(noise):
            return ConfigManager().parse_args(list(args)), None
    except SystemExit:  # tyro's exit after printing its box
        return None, noise.getvalue()


def parse_config(args: list, request: dict):
    """The config the workers will run, or (None, the problem as one line)."""
    try:
        config, box = _parse(args)
    except ValueError as error:  # ConfigManager: an unknown config function
        return None, missing_config(str(error), request)
    if config is not None:
        return config, None
    line = tyro_line(box)
    refused = SECTION_REFUSED.fullmatch(line)
    if refused:  # a section's check (a bad value of its own), which names the flag: that line alone
        return None, refused[1]
    split = [word for arg in args for word in (arg.split("=", 1) if arg.startswith("--") else [arg])]
    if "(nearest:" not in line and split != list(args):  # tyro matches `--flag=value` whole: ask again, split
        nearest = re.search(r" \(nearest: .*\)$", tyro_line(_parse(split)[1] or ""))
        line += nearest[0] if nearest else ""
    return None, f"torchtitan arguments: {line}"


def missing_config(error: str, request: dict) -> str:
    model, variant = request.get("model"), request.get("variant")
    if model and "not found" in error:
        flavor = shapes.MODELS.get(model)
        if flavor is None:
            return f"MODEL={model!r} is not a released Qwen3 (allowed: {', '.join(shapes.MODELS)})"
        family = shapes.FLAVORS[flavor].family
        allowed = [m for m, f in shapes.MODELS.items() if shapes.FLAVORS[f].family != family]
        return (
            f"MODEL={model!r} is a {family} Qwen3 and VARIANT={variant} trains the other family (allowed: "
            f"{', '.join(allowed)})"
        )
    return error.splitlines()[0]


def run(request: dict) -> dict:
    """The answer to one request: the versions first (before torch and torchtitan are imported), the parse, then
    prelaunch/stages.py's stages on the parsed config."""
    answer = {"problems": [], "warnings": [], "lines": [], "config": None, "model": None}
    if request.get("locks"):
        answer["problems"], answer["warnings"] = versions.versions(request["locks"])
    config, problem = parse_config(request["args"], request)
    if problem:
        answer["problems"].append(problem)
        return answer
    from neuron_qwen3.prelaunch import stages

    return stages.Pass(config, request, answer).run()


def main() -> int:
    import_compile.deferred()  # before torchtitan: its import compiles nothing this pass runs
    request = json.load(sys.stdin)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the answer alone
        answer = run(request)
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
