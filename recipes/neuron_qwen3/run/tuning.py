"""The fine-tuning knobs (`--tune.lr`, `--tune.warmup`) on torchtitan's own fields, and the global batch's check.

torchtitan 0.3.0 keeps the learning rate in each optimizer param group (`--optimizer.param-groups.0.optimizer-kwargs
.lr`, group 0 only) and the warm-up as whole steps (`--lr_scheduler.warmup_steps`). The project's fields set every
group and take a fraction of the steps (LR, WARMUP_STEPS). Unset (None), each means the config's value, or, for a
fine-tune (a run with `checkpoint.initial_load_path`, INIT_FROM), a fine-tuning default in its place: the config
functions' pretraining values (8e-4, with up to 600 warm-up steps) wreck a released model in a few steps. A
torchtitan flag the user typed (on the command line or in EXTRA_ARGS) wins over a default, as it would over the
config's value; the one line the rule logs names what it replaced and what it left as typed.

Fine-tuning defaults: torchtitan's own full fine-tune of Qwen3, `sft_qwen3_8b_math` in
torchtitan/models/qwen3/config_registry.py (0.3.0): AdamW at lr 2e-5, warm-up 15 of its 180 steps (8 %); torchtune's
recipes/configs/qwen3/8B_full.yaml is lower, 5e-6 without a schedule. The decay stays the config's (linear;
LR_SCHEDULE=cosine is what sft_qwen3_8b_math uses).
"""

import re

FINETUNE_LR = 2e-5
FINETUNE_WARMUP = 0.08  # of the steps
GROUP_LR = re.compile(r"optimizer\.param_groups\.(\d+)\.optimizer_kwargs\.lr")  # tyro's names, underscored
WARMUP = "lr_scheduler.warmup_steps"


def typed_flags(args) -> set:
    """The flags of a torchtitan command line, as tyro names them (`-` and `_` alike): what the user chose, told
    apart from what the config function set."""
    return {arg[2:].split("=", 1)[0].replace("-", "_") for arg in args if arg.startswith("--")}


def warmup_steps(warmup: float, total: int) -> int:
    """`warmup` as steps: a whole number from 0 is steps, below 1 a fraction of `total` (at least one step); its
    range is settings.Tune's."""
    return int(warmup) if warmup >= 1 or warmup == 0 else max(1, round(warmup * total))


def apply(config, typed: set = frozenset()) -> list:
    """Write tune.lr and tune.warmup into torchtitan's fields; where they are unset and the run is a fine-tune, the
    fine-tuning defaults, except over a torchtitan flag the user typed (`typed`: typed_flags of the command line).
    Returns the line saying what the defaults replaced and what they left as typed (or none). Ranges: settings.Tune."""
    tune, groups, scheduler = config.tune, config.optimizer.param_groups, config.lr_scheduler
    finetune = bool(config.checkpoint.initial_load_path)
    typed_groups = {int(m[1]) for flag in typed if (m := GROUP_LR.fullmatch(flag))}
    replaced, kept = [], []
    if tune.lr is not None:
        for group in groups:
            group.optimizer_kwargs["lr"] = tune.lr
    elif finetune:
        chosen = [i for i in range(len(groups)) if i not in typed_groups]
        had = ", ".join(f"{groups[i].optimizer_kwargs['lr']:g}" for i in chosen)
        for i in chosen:
            groups[i].optimizer_kwargs["lr"] = FINETUNE_LR
        replaced += [f"lr {FINETUNE_LR:g} in place of {had}"] if chosen else []
        kept += [
            f"lr {groups[i].optimizer_kwargs['lr']:g} as typed (--optimizer.param_groups.{i}.optimizer_kwargs.lr)"
            for i in sorted(typed_groups)
            if i < len(groups)
        ]
    total = scheduler.total_steps or config.training.steps
    if tune.warmup is not None:
        scheduler.warmup_steps = warmup_steps(tune.warmup, total)
    elif finetune and WARMUP in typed:
        kept.append(f"warm-up {scheduler.warmup_steps} steps as typed (--{WARMUP})")
    elif finetune:
        steps = warmup_steps(FINETUNE_WARMUP, total)
        replaced.append(f"warm-up {steps} of {total} steps in place of {scheduler.warmup_steps}")
        scheduler.warmup_steps = steps
    if not replaced and not kept:
        return []
    return [
        f"fine-tuning defaults (checkpoint.initial_load_path is set): {'; '.join(replaced) or 'none applied'}"
        + (f"; not applied, a torchtitan flag typed wins: {'; '.join(kept)}" if kept else "")
        + " (LR, WARMUP_STEPS or --tune.lr, --tune.warmup choose others)"
    ]


def batch(config, ranks: int) -> tuple:
    """(global batch, sequences per micro-step over every data-parallel rank) on `ranks` processes, as torchtitan's
    Trainer derives them: gradient accumulation is their quotient. AssertionError: parallel degrees that do not fit
    `ranks` (torchtitan's own message)."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    dims = ParallelDims.from_config(config.parallelism, ranks)
    per_step = config.training.local_batch_size * dims.dp_replicate * dims.dp_shard
    wanted = config.training.global_batch_size
    return (per_step if wanted < 0 else wanted), per_step


def batch_problem(config, ranks: int) -> str | None:
    """One line when the global batch (BATCH_SIZE) is not a whole number of micro-steps on `ranks` processes."""
    try:
        wanted, per_step = batch(config, ranks)
    except AssertionError as error:
        return f"parallelism on {ranks} ranks: {str(error) or 'the parallel degrees do not divide the ranks'}"
    if wanted % per_step == 0:
        return None
    local = config.training.local_batch_size
    return (
        f"BATCH_SIZE={wanted} (--training.global_batch_size) is not a multiple of local batch {local} x "
        f"{per_step // local} data-parallel ranks = {per_step}: use {per_step}, {2 * per_step}, {3 * per_step}, "
        f"... (gradient accumulation = BATCH_SIZE / {per_step})"
    )
