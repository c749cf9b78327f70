"""The pre-launch pass's stages (preflight.py runs them, after the versions and the parse): each adds its problems,
warnings and lines to one answer, in the order the checks depend on one another. A stage whose problem leaves the
next ones nothing sound to check ends the pass (`Stopped`); the checks of files run only on a config with no
problem.
"""

import os
import shutil

from neuron_qwen3 import data, settings, shapes
from neuron_qwen3.data import prompts
from neuron_qwen3.finish import finish
from neuron_qwen3.hf import fetch
from neuron_qwen3.lora import base_check, folders, footprint, targets
from neuron_qwen3.prelaunch import checkpoints
from neuron_qwen3.prelaunch.model_folder import hf_folder, init_from, reference_rope, trained_shape
from neuron_qwen3.report import samples
from neuron_qwen3.run import tuning

EXPORT_BYTES = {"bfloat16": 2, "float32": 4}


class Stopped(Exception):
    """A stage's problems are in the answer and the stages after it would check what they leave unsound."""


class Pass:
    """One pass over a parsed config: `run()` calls the stages in order and returns the answer they filled."""

    def __init__(self, config, request: dict, answer: dict):
        self.config, self.request, self.answer = config, request, answer
        self.tuned = self.finished = self.shape = self.resume = None

    def run(self) -> dict:
        stages = [self.settings, self.finish, self.samples, self.memory]
        if self.request.get("check_files"):
            stages += [self.files_gate, self.checkpoints, self.folders, self.datasets, self.grpo]
        try:
            for stage in stages:
                stage()
        except Stopped:
            pass
        return self.answer

    def stop_on(self, problems: list) -> None:
        if problems:
            self.answer["problems"] += problems
            raise Stopped

    def settings(self) -> None:
        """LoRA's targets, the chat template on the first records, the batch, EPOCHS and VALIDATION: each before
        what needs it (finishing tokenizes the data with the template)."""
        config = self.config
        try:
            self.tuned = folders.settings(config)  # INIT_FROM naming a PEFT adapter: its settings
            problems = targets.problems(config, self.tuned) if self.tuned else []
        except targets.LoRAError as error:
            problems = [str(error)]
        if not problems:
            problems = rendered(config)
        if not problems:
            problem = tuning.batch_problem(config, self.request["ranks"]) or epochs(config, self.request)
            problems = ([problem] if problem else []) + validation(config, self.request.get("check_files"))
        self.stop_on(problems)

    def finish(self) -> None:
        """The config finished exactly as every worker finishes it (the launcher passes --device): --dry-run shows
        what trains, and each line saying what finishing derived is in the answer."""
        config = self.config
        try:
            self.finished = finish(
                config, self.request["ranks"], config.device, tuning.typed_flags(self.request["args"])
            )
        except (ValueError, data.DataError) as error:
            epochs_error = isinstance(error, data.DataError) and config.dataloader.epochs
            self.stop_on([f"EPOCHS: {error}" if epochs_error else str(error)])
        self.answer["lines"] += self.finished.lines
        self.tuned = self.finished.lora

    def samples(self) -> None:
        try:
            self.answer["lines"] += samples.before_launch(self.config)
        except data.DataError as error:
            self.stop_on([f"SAMPLE_PROMPTS: {error}"])

    def memory(self) -> None:
        """The model's size and whether its sharded state fits a rank (a warning: the run may still fit)."""
        config, request = self.config, self.request
        if request.get("print_config"):
            self.answer["config"] = config.to_dict()
        self.shape = shape = trained_shape(config)
        if shape is None:
            return
        neuron = getattr(config, "neuron", None) or settings.Neuron()  # a user's MODULE may lack the section
        memory = shapes.NEURON_GIB_PER_CORE[neuron.logical_nc_config] if config.device == "neuron" else None
        fits, why = shapes.fit(shape.parameters(), request["ranks"], memory)
        self.answer["model"] = {"parameters": shape.parameters(), "fits": fits, "why": why}
        if self.tuned and request.get("print_config"):  # --dry-run: built on meta, adapters in, base frozen
            self.answer["model"]["lora"] = footprint.dry_run(config, self.tuned, request["ranks"]).line()
        if not fits and not self.tuned:  # LoRA holds gradients and Adam state for its adapters only
            self.answer["warnings"].append(f"{config.report.model or 'the model'}: {why}")

    def files_gate(self) -> None:
        """The files are checked only for a config with no problem (the versions' included)."""
        if self.answer["problems"]:
            raise Stopped

    def checkpoints(self) -> None:
        """CHECKPOINT_DIR: the step a run resumes from, broken steps moved aside on node 0."""
        checkpoint, answer = self.config.checkpoint, self.answer
        if not checkpoint.enable or not checkpoint.folder or checkpoint.load_only:
            return
        try:
            resume, lines = checkpoints.prepare(
                checkpoint.folder, self.request["node_rank"], move=self.request.get("fix_checkpoints", False)
            )
        except OSError as error:
            self.stop_on([str(error)])
        answer["warnings"] += lines
        if checkpoint.load_step >= 0:  # torchtitan loads that step, not the newest
            resume = checkpoint.load_step
            folder = os.path.join(checkpoint.folder, f"step-{resume}")
            why = checkpoints.problem(folder) if os.path.isdir(folder) else "no such folder"
            if why:
                self.stop_on([f"--checkpoint.load_step={resume}: {folder}: {why}"])
        answer["lines"].append(
            f"checkpoints: resuming from step {resume} in {checkpoint.folder}"
            if resume is not None
            else f"checkpoints: none complete in {checkpoint.folder}: starting at step 0"
        )
        self.resume = resume

    def folders(self) -> None:
        """INIT_FROM, DPO_REFERENCE, a resumed adapter's base and the export's folder."""
        config, shape, tuned = self.config, self.shape, self.tuned
        problems, warnings = init_from(config, shape, None if tuned else self.resume)  # LoRA loads its base each start
        reference = getattr(getattr(config, "preference", None), "reference", "")  # finish.py resolved it
        if reference and reference != config.checkpoint.initial_load_path:
            problems += hf_folder("DPO_REFERENCE", reference, shape) or reference_rope(reference, config)
        if tuned and self.resume is not None and not problems:
            problems = base_check.check_resume_base(
                os.path.join(config.checkpoint.folder, f"step-{self.resume}"), config.checkpoint.initial_load_path
            )
        exported = shape.parameters() if shape and (not tuned or config.export.merged) else None  # an adapter is small
        self.answer["problems"] += problems + export(config, exported)
        self.answer["warnings"] += warnings

    def datasets(self) -> None:
        """Every record of each local source read as the workers read it (formats), against METHOD."""
        config = self.config
        method = getattr(getattr(config, "preference", None), "method", "sft")
        for path in data.mix.local_paths(getattr(config.dataloader, "source", "")) or ():
            found = data.scan(path, config.dataloader.field)
            problem = f"DATASET: {found.problem}" if found.problem else data.method_problem(method, found.kind, path)
            if problem:
                self.answer["problems"].append(problem)
            else:
                self.answer["lines"].append(
                    f"dataset: {found.counts['records']} records"
                    + (f", {found.counts['turns']} turns" if found.counts["turns"] else "")
                    + f" in {path}"
                )

    def grpo(self) -> None:
        """METHOD=grpo: the user's reward functions import here, as in every worker, and every prompt fits."""
        if getattr(getattr(self.config, "preference", None), "method", "sft") != "grpo":
            return
        from neuron_qwen3.rl import rewards

        try:
            rewards.of_run(self.config)
        except rewards.RewardError as error:
            self.answer["problems"].append(str(error))
        self.answer["problems"] += [] if self.answer["problems"] else grpo_prompts(self.config)


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
    if not data.mix.local_paths(config.dataloader.source):
        return f"EPOCHS needs a local DATASET; {config.dataloader.source} is streamed: give STEPS instead"
    return None


def grpo_prompts(config) -> list:
    """Every prompt of the local DATASET and a VALIDATION file tokenized as the rollout does: a prompt too long for
    the window is one line now, not a worker's error when its batch is reached, mid-run."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

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
