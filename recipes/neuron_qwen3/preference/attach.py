"""METHOD=dpo on a built trainer: its reference, the DPO loss as torchtitan's loss_fn, the metrics at each log,
and with VALIDATION the held-out pairs' metrics at each validation."""

import math

from neuron_qwen3 import data
from neuron_qwen3.preference.dpo import Dpo
from neuron_qwen3.preference.reference import AdaptersOff, Frozen, Precomputed


def attach(trainer, prepare) -> Dpo | None:
    """The DPO loss on `trainer` (None under SFT; DataError when the data's kind is not the method's): it replaces
    the training loss_fn (the validator has taken its own), and every logging step gets its means (`dpo/...`, in
    metrics.jsonl, TensorBoard and W&B). `prepare`: torchtitan's post_dataloading_process, for a first pass."""
    settings = trainer.config.preference
    kind = getattr(getattr(trainer.dataloader, "dataset", None), "kind", None)  # the project's loader's
    problem = data.method_problem(settings.method == "dpo", kind, trainer.config.dataloader.source)
    if problem:  # a Hub dataset, which the pre-launch pass does not read
        raise data.DataError(problem)
    if settings.method != "dpo":
        return None
    dims = trainer.parallel_dims
    assert not (dims.pp_enabled or dims.cp_enabled or dims.tp_enabled), (
        "METHOD=dpo runs on data-parallel (FSDP) ranks: no pipeline, context or tensor parallelism"
    )
    model = trainer.model_parts[0]
    reference = held_out = Frozen(trainer, settings.reference) if settings.reference else AdaptersOff(model)
    if settings.precompute:  # the first step's pass, over the training and the validation tables
        passes = {"trainer": trainer, "prepare": prepare, "reference": reference}
        reference = Precomputed(passes, "training", trainer.dataloader.dataset)
        if trainer.config.validator.enable:  # the validator builds its loader at each validation: one of its own
            v = trainer.validator
            loader = v.dl_config.build(
                dp_world_size=v.dp_world_size,
                dp_rank=v.dp_rank,
                tokenizer=v.tokenizer,
                seq_len=v.seq_len,
                local_batch_size=v.local_batch_size,
            )
            held_out = Precomputed(passes, "validation", loader.dataset.packed)
    group = dims.get_optional_mesh("loss").get_group() if dims.dp_cp_enabled else None
    loss = Dpo(
        model, reference, settings.beta, settings.loss, settings.sft_weight, trainer.gradient_accumulation_steps, group
    )
    trainer.loss_fn = loss
    log = trainer.metrics_processor.log

    def log_with_dpo(step, *args, extra_metrics=None, **kwargs):
        found = loss.interval()  # every rank: a collective
        return log(step, *args, extra_metrics={**(extra_metrics or {}), **(found or {})}, **kwargs)

    trainer.metrics_processor.log = log_with_dpo
    if trainer.config.validator.enable:
        validate_pairs(trainer, Dpo(model, held_out, settings.beta, settings.loss, settings.sft_weight, 1, group))
    return loss


def validate_pairs(trainer, held_out: Dpo) -> None:
    """torchtitan's validator on held-out pairs: the reference pass after its data step, the DPO loss as its
    loss_fn, and the logged validation loss the pairs' mean DPO loss, with their rewards and accuracy beside it
    (the validator's own figure divides by tokens)."""
    validator, metrics = trainer.validator, trainer.metrics_processor
    prepare, log_validation = validator.post_dataloading_process, metrics.log_validation

    def post_dataloading_process(input_dict, labels, model_parts):
        records = input_dict.pop("record", None)
        inputs, labels, extra = prepare(input_dict, labels, model_parts)
        held_out.reference_pass(inputs, labels, extra, records)
        return inputs, labels, extra

    def log_pairs(loss, step, extra_metrics=None):
        found = held_out.interval() or {}  # every rank: a collective
        extra = {**(extra_metrics or {}), **{f"validation_metrics/{key}": value for key, value in found.items()}}
        return log_validation(found.get("dpo/loss", math.nan), step, extra_metrics=extra)

    validator.post_dataloading_process, validator.loss_fn = post_dataloading_process, held_out
    metrics.log_validation = log_pairs
