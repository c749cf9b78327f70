"""`python -m neuron_qwen3.preflight`: the launcher's pre-launch pass, in a child with the real libraries.

The launcher (stdlib only, it never imports torch) writes one JSON request on stdin: the workers' exact torchtitan
arguments and what to do; this process answers one JSON object, the last line of its stdout:

    {"problems": [...], "warnings": [...], "lines": [...], "config": {...} | null, "model": {...} | null}

Each problem and warning is one line; the launcher prints them and, on a problem, starts nothing (exit 2). What is
checked, with the library that reads it:

| check | problem | warning |
|---|---|---|
| flags | a flag the config does not have, a bad value (tyro's parse, as the workers parse them) | |
| config | MODEL of another family than the variant, or no released Qwen3 | |
| memory | | the sharded weights, gradients and Adam state take over 60 % of a rank's device memory |
| init_from | no model folder, no weights, another architecture or shape than the run trains | a complete checkpoint wins |
| export | export.dir inside the checkpoint folder, less free space than the export needs | |
| dataset | a local source whose records cannot be trained on (data.scan) | |
| checkpoints | a read error other than "not found" | a broken step-N (moved aside on node 0), an unfinished one |
"""

import contextlib
import io
import json
import os
import re
import shutil
import sys

from neuron_qwen3 import checkpoints, data, shapes

EXPORT_BYTES = {"bfloat16": 2, "float32": 4}


def tyro_line(text: str) -> str:
    """tyro's error box (its message, and the flags it suggests) as one line."""
    sections = [[line.strip() for line in part.splitlines() if line.strip()]
                for part in re.split(r"\n\s*-{20,}\s*", text)]
    message = " ".join(next((part for part in sections[1:] if part), ["the arguments do not parse"]))
    suggested = [line.split()[0] for part in sections if part and part[0].startswith("Perhaps you meant")
                 for line in part[1:] if line.startswith("--")]
    return message + (f" (nearest: {', '.join(suggested[:3])})" if suggested else "")


def parse_config(args: list, request: dict):
    """The config the workers will run, or (None, the problem as one line)."""
    from torchtitan.config import ConfigManager

    noise = io.StringIO()
    try:
        with contextlib.redirect_stderr(noise), contextlib.redirect_stdout(noise):
            return ConfigManager().parse_args(list(args)), None
    except SystemExit:  # tyro's exit after printing its box
        return None, f"torchtitan arguments: {tyro_line(noise.getvalue())}"
    except ValueError as error:  # ConfigManager: an unknown config function
        return None, missing_config(str(error), request)


def missing_config(error: str, request: dict) -> str:
    model, variant = request.get("model"), request.get("variant")
    if model and "not found" in error:
        flavor = shapes.MODELS.get(model)
        if flavor is None:
            return f"MODEL={model!r} is not a released Qwen3 (allowed: {', '.join(shapes.MODELS)})"
        family = shapes.FLAVORS[flavor].family
        allowed = [m for m, f in shapes.MODELS.items() if shapes.FLAVORS[f].family != family]
        return (f"MODEL={model!r} is a {family} Qwen3 and VARIANT={variant} trains the other family (allowed: "
                f"{', '.join(allowed)})")
    return error.splitlines()[0]


def trained_shape(config) -> shapes.Shape | None:
    """The shape the run trains: the native model config, or the v5 model's config.json (None: not readable)."""
    if hasattr(config.model_spec.model, "layers"):
        return shapes.of_model_config(config.model_spec.model)
    try:
        from transformers import AutoConfig

        return shapes.of_model_config(AutoConfig.from_pretrained(config.hf_model))
    except (OSError, ValueError):
        return None


def init_from(config, shape: shapes.Shape | None, resume_step) -> tuple[list, list]:
    source = config.checkpoint.initial_load_path
    if not source or not config.checkpoint.initial_load_in_hf:
        return [], []
    if resume_step is not None:
        return [], [f"INIT_FROM is ignored: {config.checkpoint.folder} holds a complete checkpoint (step "
                    f"{resume_step}), and the run resumes from it"]
    from safetensors import SafetensorError, safe_open

    try:
        with open(os.path.join(source, "config.json")) as f:
            found = json.load(f)
        weights = sorted(name for name in os.listdir(source) if name.endswith(".safetensors"))
        if not weights:
            return [f"INIT_FROM={source!r}: {source} has no *.safetensors weights"], []
        for name in weights:
            with safe_open(os.path.join(source, name), "pt"):
                pass
    except FileNotFoundError as error:
        return [f"INIT_FROM={source!r}: no {os.path.basename(error.filename or 'folder')} there"], []
    except (OSError, ValueError, SafetensorError) as error:  # json, safetensors header errors
        return [f"INIT_FROM={source!r}: {str(error).splitlines()[0]}"], []
    if shape is None:
        return [], []
    for name, trained in shapes.hf_config(shape).items():
        if name in ("architectures", "hidden_act", "attention_bias", "norm_topk_prob", "decoder_sparse_step",
                    "mlp_only_layers") or found.get(name) == trained:
            continue
        return [f"INIT_FROM={source!r} has {name}={found.get(name)!r} but the run trains {name}={trained!r}"], []
    return [], []


def export(config, parameters: int | None) -> list:
    target = config.export.dir
    if not target:
        return []
    target = os.path.abspath(target)
    folder = config.checkpoint.folder if config.checkpoint.enable else None
    if folder and os.path.commonpath([target, os.path.abspath(folder)]) == os.path.abspath(folder):
        return [f"EXPORT_DIR={target!r} is inside CHECKPOINT_DIR, where a model folder would be taken for a "
                "checkpoint: choose another folder"]
    if parameters is None:
        return []
    existing = target
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    needed, free = parameters * EXPORT_BYTES[config.export.dtype], shutil.disk_usage(existing).free
    if free < needed:
        return [f"EXPORT_DIR={target!r} has {free >> 20} MiB free but the export needs about {needed >> 20} MiB"]
    return []


def run(request: dict) -> dict:
    answer = {"problems": [], "warnings": [], "lines": [], "config": None, "model": None}
    config, problem = parse_config(request["args"], request)
    if problem:
        answer["problems"].append(problem)
        return answer
    if request.get("print_config"):
        answer["config"] = config.to_dict()
    shape = trained_shape(config)
    if shape is not None:
        fits, why = shapes.fit(shape.parameters(), request["ranks"], request.get("memory_gib"))
        answer["model"] = {"parameters": shape.parameters(), "fits": fits, "why": why}
        if not fits:
            answer["warnings"].append(f"{config.report.model or 'the model'}: {why}")
    if not request.get("check_files"):
        return answer
    resume = None
    if config.checkpoint.enable and config.checkpoint.folder and not config.checkpoint.load_only:
        try:
            resume, lines = checkpoints.prepare(config.checkpoint.folder, request["node_rank"],
                                                move=request.get("fix_checkpoints", False))
        except OSError as error:
            answer["problems"].append(str(error))
            return answer
        answer["warnings"] += lines
        answer["lines"].append(f"checkpoints: resuming from step {resume} in {config.checkpoint.folder}"
                               if resume is not None else
                               f"checkpoints: none complete in {config.checkpoint.folder}: starting at step 0")
    problems, warnings = init_from(config, shape, resume)
    answer["problems"] += problems + export(config, shape.parameters() if shape else None)
    answer["warnings"] += warnings
    source = getattr(config.dataloader, "source", None)
    problem = data.scan(source, config.dataloader.field) if source else None
    if problem:
        answer["problems"].append(f"DATASET: {problem}")
    return answer


def main() -> int:
    request = json.load(sys.stdin)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the answer alone
        answer = run(request)
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
