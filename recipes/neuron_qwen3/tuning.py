"""The fine-tuning knobs (`--tune.lr`, `--tune.warmup`) on torchtitan's own fields, and the global batch's check.

torchtitan 0.3.0 keeps the learning rate in each optimizer param group (`--optimizer.param-groups.0.optimizer-kwargs
.lr`, group 0 only) and the warm-up as whole steps (`--lr_scheduler.warmup_steps`). The project's fields set every
group and take a fraction of the steps (LR, WARMUP_STEPS). A fine-tune (a run with `checkpoint.initial_load_path`,
INIT_FROM) gets fine-tuning values in place of the config's pretraining ones (8e-4, with up to 600 warm-up steps,
wrecks a released model in a few steps), but only where nothing was given: the project's field is None and
torchtitan's own field still holds what the config function set (`described` records it in tune.config_lrs and
tune.config_warmup), so `--optimizer.param-groups.0.optimizer-kwargs.lr 0` or a user's config function with its
own rate keeps it. Giving exactly the config's value through torchtitan's flag cannot be told from not giving it:
the one line the rule logs says what it replaced. The rule runs in the trainer (`RunHooks.init_distributed`, once
EPOCHS has sized the steps), so stock `torchtitan.train` behaves as the launcher does; the pre-launch pass runs it
on its parsed config, so `--dry-run` prints the values that will train and `--check` prints the line.

Fine-tuning defaults: torchtitan's own full fine-tune of Qwen3, `sft_qwen3_8b_math` in
torchtitan/models/qwen3/config_registry.py (0.3.0): AdamW at lr 2e-5, warm-up 15 of its 180 steps (8 %); torchtune's
recipes/configs/qwen3/8B_full.yaml is lower, 5e-6 without a schedule; issue 20 asks for 1e-5 to 2e-5 with a short
warm-up. The decay stays the config's (linear; LR_SCHEDULE=cosine is what sft_qwen3_8b_math uses).
"""

FINETUNE_LR = 2e-5
FINETUNE_WARMUP = 0.08  # of the steps


def warmup_steps(warmup: float, total: int) -> int:
    """`warmup` as steps: a whole number from 0 is steps, below 1 a fraction of `total` (at least one step)."""
    if warmup < 0 or (warmup >= 1 and not float(warmup).is_integer()):
        raise ValueError(f"--tune.warmup={warmup} is neither a whole number of steps nor a fraction below 1")
    return int(warmup) if warmup >= 1 or warmup == 0 else max(1, round(warmup * total))


def apply(config) -> list:
    """Write tune.lr and tune.warmup into torchtitan's fields, or for a fine-tune the defaults in place of values the
    config function set and nothing changed since; returns the line saying what the defaults replaced (or none)."""
    tune, groups, scheduler = config.tune, config.optimizer.param_groups, config.lr_scheduler
    finetune = bool(config.checkpoint.initial_load_path)
    had = tuple(group.optimizer_kwargs["lr"] for group in groups)
    lr_default = finetune and tune.lr is None and bool(tune.config_lrs) and had == tuple(tune.config_lrs)
    warmup_default = finetune and tune.warmup is None and scheduler.warmup_steps == tune.config_warmup >= 0
    lr = FINETUNE_LR if lr_default else tune.lr
    warmup = FINETUNE_WARMUP if warmup_default else tune.warmup
    replaced = []
    if lr is not None:
        if not 0 < lr <= 1:
            raise ValueError(f"--tune.lr={lr} is not a learning rate above 0 and at most 1")
        for group in groups:
            group.optimizer_kwargs["lr"] = lr
        replaced += [f"lr {lr:g} for the config's {', '.join(f'{value:g}' for value in had)}"] if lr_default else []
    if warmup is not None:
        total = scheduler.total_steps or config.training.steps
        steps = warmup_steps(warmup, total)
        replaced += [f"warm-up {steps} of {total} steps for {scheduler.warmup_steps}"] if warmup_default else []
        scheduler.warmup_steps = steps
    if not replaced:
        return []
    return [f"fine-tuning defaults (checkpoint.initial_load_path is set): {'; '.join(replaced)} (LR, WARMUP_STEPS "
            "or --tune.lr, --tune.warmup choose others)"]


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
    return (f"BATCH_SIZE={wanted} (--training.global_batch_size) is not a multiple of local batch {local} x "
            f"{per_step // local} data-parallel ranks = {per_step}: use {per_step}, {2 * per_step}, {3 * per_step}, "
            f"... (gradient accumulation = BATCH_SIZE / {per_step})")
