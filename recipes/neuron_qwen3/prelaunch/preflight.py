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
"""

import contextlib
import io
import json
import os
import re
import shutil
import sys

from neuron_qwen3 import shapes
from neuron_qwen3.hf import fetch
from neuron_qwen3.prelaunch import versions
from neuron_qwen3.prelaunch.model_folder import hf_folder, init_from, reference_rope, trained_shape
from neuron_qwen3.quirks import import_compile
from neuron_qwen3.run import tuning

# tyro's line for a section that refused itself (settings.Section, data.DataLoader.Config): the section's own line
SECTION_REFUSED = re.compile(r"Error parsing [A-Za-z_][\w.]*: (.+)")

EXPORT_BYTES = {"bfloat16": 2, "float32": 4}


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


def export(config, parameters: int | None) -> list:
    target = config.export.dir
    if not target:
        return []
    target = os.path.abspath(target)
    folder = config.checkpoint.folder if config.checkpoint.enable else None
    if folder and os.path.commonpath([target, os.path.abspath(folder)]) == os.path.abspath(folder):
        return [
            f"EXPORT_DIR={target!r} is inside CHECKPOINT_DIR, where a model folder would be taken for a "
            "checkpoint: choose another folder"
        ]
    if parameters is None:
        return []
    needed, free = parameters * EXPORT_BYTES[config.export.dtype], shutil.disk_usage(fetch.nearest(target)).free
    if free < needed:
        return [f"EXPORT_DIR={target!r} has {free >> 20} MiB free but the export needs about {needed >> 20} MiB"]
    return []


def validation(config, check_files: bool) -> list:
    """VALIDATION: a fraction of a local DATASET, or a local file or folder whose every record trains."""
    from neuron_qwen3 import data

    held, source = getattr(config.dataloader, "validation", ""), getattr(config.dataloader, "source", "")
    if not held:
        return []
    if data.records.fraction(held) is not None:
        return (
            []
            if data.mix.local_paths(source)
            else [
                f"VALIDATION={held} holds records out of DATASET, which is "
                f"not local ({source}): give a local DATASET, or a "
                "VALIDATION file"
            ]
        )
    if not os.path.exists(held):
        return [f"VALIDATION={held!r}: no such file or folder (nor a fraction like 0.05)"]
    found = data.scan(held, config.dataloader.field) if check_files else None
    if found is None:
        return []
    method = getattr(getattr(config, "preference", None), "method", "sft")
    problem = (
        f"VALIDATION: {found.problem}" if found.problem else data.method_problem(method, found.kind, held, "VALIDATION")
    )
    return [problem] if problem else []


def epochs(config, request: dict) -> str | None:
    """What stops EPOCHS before its steps are counted (finish.py counts them as every worker does)."""
    if not getattr(config.dataloader, "epochs", 0):
        return None
    if any(arg == "--training.steps" or arg.startswith("--training.steps=") for arg in request["args"]):
        return "STEPS and EPOCHS are both set: EPOCHS derives the steps from the data; give one of them"
    from neuron_qwen3 import data

    if not data.mix.local_paths(config.dataloader.source):
        return f"EPOCHS needs a local DATASET; {config.dataloader.source} is streamed: give STEPS instead"
    return None


def run(request: dict) -> dict:
    answer = {"problems": [], "warnings": [], "lines": [], "config": None, "model": None}
    if request.get("locks"):  # first, before torch and torchtitan are imported
        answer["problems"], answer["warnings"] = versions.versions(request["locks"])
    config, problem = parse_config(request["args"], request)
    if problem:
        answer["problems"].append(problem)
        return answer
    from neuron_qwen3 import data, settings
    from neuron_qwen3.finish import finish
    from neuron_qwen3.report import samples
    from neuron_qwen3.lora import base_check, folders, footprint, targets

    try:
        tuned = folders.settings(config)  # INIT_FROM naming a PEFT adapter: its settings
        problems = targets.problems(config, tuned) if tuned else []
    except targets.LoRAError as error:
        problems = [str(error)]
    if not problems:  # a mix's form first; the template before EPOCHS' plan tokenizes the data with it
        problems = rendered(config)
    if not problems:
        problem = tuning.batch_problem(config, request["ranks"]) or epochs(config, request)
        problems = ([problem] if problem else []) + validation(config, request.get("check_files"))
    if not problems:
        try:  # exactly as every worker finishes it (the launcher passes --device): --dry-run shows what trains
            finished = finish(config, request["ranks"], config.device, tuning.typed_flags(request["args"]))
        except (ValueError, data.DataError) as error:
            epochs_error = isinstance(error, data.DataError) and config.dataloader.epochs
            problems = [f"EPOCHS: {error}" if epochs_error else str(error)]
    answer["problems"] += problems
    if problems:
        return answer
    answer["lines"] += finished.lines
    try:
        answer["lines"] += samples.before_launch(config)
    except data.DataError as error:
        answer["problems"].append(f"SAMPLE_PROMPTS: {error}")
        return answer
    tuned = finished.lora
    if request.get("print_config"):
        answer["config"] = config.to_dict()
    shape = trained_shape(config)
    if shape is not None:
        neuron = getattr(config, "neuron", None) or settings.Neuron()  # a user's MODULE may lack the section
        memory = shapes.NEURON_GIB_PER_CORE[neuron.logical_nc_config] if config.device == "neuron" else None
        fits, why = shapes.fit(shape.parameters(), request["ranks"], memory)
        answer["model"] = {"parameters": shape.parameters(), "fits": fits, "why": why}
        if tuned and request.get("print_config"):  # --dry-run: built on meta, adapters in, base frozen
            answer["model"]["lora"] = footprint.dry_run(config, tuned, request["ranks"]).line()
        if not fits and not tuned:  # LoRA holds gradients and Adam state for its adapters only
            answer["warnings"].append(f"{config.report.model or 'the model'}: {why}")
    if not request.get("check_files") or answer["problems"]:
        return answer
    from neuron_qwen3 import data
    from neuron_qwen3.prelaunch import checkpoints

    resume = None
    if config.checkpoint.enable and config.checkpoint.folder and not config.checkpoint.load_only:
        try:
            resume, lines = checkpoints.prepare(
                config.checkpoint.folder, request["node_rank"], move=request.get("fix_checkpoints", False)
            )
        except OSError as error:
            answer["problems"].append(str(error))
            return answer
        answer["warnings"] += lines
        if config.checkpoint.load_step >= 0:  # torchtitan loads that step, not the newest
            resume = config.checkpoint.load_step
            folder = os.path.join(config.checkpoint.folder, f"step-{resume}")
            why = checkpoints.problem(folder) if os.path.isdir(folder) else "no such folder"
            if why:
                answer["problems"].append(f"--checkpoint.load_step={resume}: {folder}: {why}")
                return answer
        answer["lines"].append(
            f"checkpoints: resuming from step {resume} in {config.checkpoint.folder}"
            if resume is not None
            else f"checkpoints: none complete in {config.checkpoint.folder}: starting at step 0"
        )
    problems, warnings = init_from(config, shape, None if tuned else resume)  # LoRA loads its base every start
    reference = getattr(getattr(config, "preference", None), "reference", "")  # finish.py resolved it
    if reference and reference != config.checkpoint.initial_load_path:
        problems += hf_folder("DPO_REFERENCE", reference, shape) or reference_rope(reference, config)
    if tuned and resume is not None and not problems:
        problems = base_check.check_resume_base(
            os.path.join(config.checkpoint.folder, f"step-{resume}"), config.checkpoint.initial_load_path
        )
    exported = shape.parameters() if shape and (not tuned or config.export.merged) else None  # an adapter is small
    answer["problems"] += problems + export(config, exported)
    answer["warnings"] += warnings
    for path in data.mix.local_paths(getattr(config.dataloader, "source", "")) or ():
        found = data.scan(path, config.dataloader.field)  # every record read as the workers read it (formats)
        method = getattr(getattr(config, "preference", None), "method", "sft")
        problem = f"DATASET: {found.problem}" if found.problem else data.method_problem(method, found.kind, path)
        if problem:
            answer["problems"].append(problem)
        else:
            answer["lines"].append(
                f"dataset: {found.counts['records']} records"
                + (f", {found.counts['turns']} turns" if found.counts["turns"] else "")
                + f" in {path}"
            )
    if getattr(getattr(config, "preference", None), "method", "sft") == "grpo":
        from neuron_qwen3.rl import rewards

        try:
            rewards.of_run(config)  # the user's reward functions import here, as in every worker
        except rewards.RewardError as error:
            answer["problems"].append(str(error))
        answer["problems"] += [] if answer["problems"] else grpo_prompts(config)
    return answer


def grpo_prompts(config) -> list:
    """Every prompt of the local DATASET and a VALIDATION file tokenized as the rollout does: a prompt too long for
    the window is one line now, not a worker's error when its batch is reached, mid-run."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    from neuron_qwen3 import data
    from neuron_qwen3.data import prompts
    from neuron_qwen3.rl import rollout

    held = config.dataloader.validation
    named = [("DATASET", path) for path in data.mix.local_paths(config.dataloader.source) or ()]
    named += [("VALIDATION", held)] if held and data.records.fraction(held) is None else []
    tokenizer = HuggingFaceTokenizer(tokenizer_path=data.tokenizer_of(config))
    problem = prompts.grpo_problem(named, tokenizer, rollout.room_of(config), config.grpo.max_completion)
    return [problem] if problem else []


def rendered(config) -> list:
    """The first record of each local source rendered with the run's chat template: a template that does not
    compile or refuses the data is one line here, not a traceback in every worker (or in EPOCHS' plan)."""
    from neuron_qwen3 import data

    source = getattr(config.dataloader, "source", "")
    try:
        paths = data.mix.local_paths(source) if source else None
    except data.DataError as error:
        return [str(error)]
    for path in paths or ():
        try:
            problem = data.render_first(
                path, config.dataloader.field, config.dataloader.train_on, data.tokenizer_of(config)
            )
        except data.DataError as error:
            problem = str(error)
        if problem:
            return [f"DATASET: {problem}"]
    return []


def main() -> int:
    import_compile.deferred()  # before torchtitan: its import compiles nothing this pass runs
    request = json.load(sys.stdin)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the answer alone
        answer = run(request)
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
