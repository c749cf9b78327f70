"""METHOD=dpo on a built trainer: its reference, the DPO loss that replaces the cross-entropy, and with VALIDATION
the held-out pairs' loss. The trainer (trainer.py) calls them from its loss, log and validation hooks."""

import math

from neuron_qwen3 import data
from neuron_qwen3.preference.dpo import Dpo
from neuron_qwen3.preference.reference import AdaptersOff, Frozen, Precomputed


def dpo_losses(trainer, prepare) -> tuple[Dpo | None, Dpo | None]:
    """(the training loss, the held-out pairs' loss with VALIDATION) under METHOD=dpo; (None, None) under SFT.
    DataError when the data's kind is not the method's. `prepare`: torchtitan's post_dataloading_process, for a
    first pass."""
    settings = trainer.config.preference
    kind = getattr(getattr(trainer.dataloader, "dataset", None), "kind", None)  # the project's loader's
    problem = data.method_problem(settings.method, kind, trainer.config.dataloader.source)
    if problem:  # a Hub dataset, which the pre-launch pass does not read
        raise data.DataError(problem)
    if settings.method != "dpo":
        return None, None
    dims = trainer.parallel_dims
    assert not (dims.pp_enabled or dims.cp_enabled or dims.tp_enabled), (
        "METHOD=dpo runs on data-parallel (FSDP) ranks: no pipeline, context or tensor parallelism"
    )
    model = trainer.model_parts[0]
    reference = held_out = Frozen(trainer, settings.reference) if settings.reference else AdaptersOff(model)
    validating = trainer.config.validator.enable
    if settings.precompute:  # the first step's pass, over the training and the validation tables
        passes = {"trainer": trainer, "prepare": prepare, "reference": reference}
        reference = Precomputed(passes, "training", trainer.dataloader.dataset)
        if validating:  # the validator builds its loader at each validation: one of its own
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
    if not validating:
        return loss, None
    return loss, Dpo(model, held_out, settings.beta, settings.loss, settings.sft_weight, 1, group)


def validation_metrics(held_out: Dpo) -> tuple[float, dict]:
    """The validation's loss, the held-out pairs' mean DPO loss (the validator's own figure divides by tokens), and
    their rewards and accuracy as validation metrics. Every rank: a collective."""
    found = held_out.interval() or {}
    return found.get("dpo/loss", math.nan), {f"validation_metrics/{key}": value for key, value in found.items()}
