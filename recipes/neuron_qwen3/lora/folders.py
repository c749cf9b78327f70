"""LoRA's files: adapter-only checkpoints over a base loaded again each start, and PEFT adapter folders in and out.

Checkpoints (CHECKPOINT_DIR) hold the adapters, the optimizer (whose state is the adapters' only), the schedule,
the data position, the train state and `lora_base`, the base's fingerprint. The base is not in them: every start,
resumed or not, loads it from INIT_FROM (weights.load_hf: `prepare_checkpoints`, before
torchtitan's `checkpointer.load`, whose initial load is then switched off), and a resume refuses a base whose
fingerprint differs from the one saved (base_check.py).

The export is a PEFT adapter folder: adapter_config.json (`base_model_name_or_path`: the base folder that was
loaded), adapter_model.safetensors under PEFT's key names (`base_model.model.<module>.lora_A.weight`; routed
experts as PEFT's `target_parameters` lay them out: A [E*r, in], B [out, r*E], the gate_up ParamWrapper inside
the down_proj one), and the tokenizer. EXPORT_MERGED=1: the merged model at EXPORT_DIR, written as weights.py
writes any export, W + s B A computed as PEFT's merge computes it, with the adapter in EXPORT_DIR/adapter.
"""

import functools
import json
import os
import re
import shutil
from dataclasses import replace

import torch
from torch.distributed.tensor import DTensor, distribute_tensor
from torchtitan.components.checkpoint import MODEL, ModelWrapper
from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.tools.logging import logger

from neuron_qwen3.hf import shards, weights, write
from neuron_qwen3.lora import adapters
from neuron_qwen3.lora.adapters import Site
from neuron_qwen3.lora.targets import LoRAError
from neuron_qwen3.lora.base_check import BASE_STATE, BaseCheck
from neuron_qwen3.settings import Lora

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
MERGED_ADAPTER = "adapter"  # EXPORT_MERGED=1: the adapter's folder inside the merged model's
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


# ---- checkpoints: adapters only, the base from INIT_FROM ------------------------------------------------------


class AdapterStates(ModelWrapper):
    """The model entry of a LoRA checkpoint: the adapters' tensors only (loading takes any subset, as torchtitan's)."""

    def _get_state_dict(self) -> dict:
        return {key: value for key, value in super()._get_state_dict().items() if adapters.is_adapter_key(key)}


def sites(trainer) -> list[Site]:
    return [adapter.site for part in trainer.model_parts for adapter in adapters.adapters(part)]


def prepare_checkpoints(trainer, settings: Lora) -> None:
    """Before torchtitan's `checkpointer.load`: load the base from INIT_FROM, make checkpoints adapter-only with the
    base's fingerprint, and (INIT_FROM named an adapter, no checkpoint to resume) load that adapter."""
    checkpointer = trainer.checkpointer
    base = checkpointer.initial_load_path if checkpointer.enable and checkpointer.initial_load_in_hf else None
    if not base:
        raise LoRAError("LoRA trains adapters over a model's weights, and this run loads none: set INIT_FROM")
    logger.info(f"LoRA: loading the frozen base from {base}")
    loaded = weights.load_hf(trainer, base, keep=lambda key: not adapters.is_adapter_key(key))
    assert loaded, "LoRA trains on FSDP (and HSDP) only, where every weight is held as whole rows"
    checkpointer.states[MODEL] = AdapterStates(trainer.model_parts)
    checkpointer.states[BASE_STATE] = BaseCheck(base)
    checkpointer.initial_load_path, checkpointer.initial_load_in_hf = None, False  # the base is loaded: no more
    if settings.adapter and weights.complete_step(checkpointer) == -1:
        load_adapter(trainer, settings.adapter)


# ---- PEFT names and layouts ------------------------------------------------------------------------------------


def peft_names(all_sites: list[Site]) -> dict[str, str]:
    """{adapter key: PEFT's module prefix}. PEFT nests the ParamWrappers of one experts module: gate_up_proj (the
    parameter registered first) inside down_proj, so with both targeted gate_up's keys gain `.base_layer`."""
    both = {s.hf_module for s in all_sites if s.hf_param == "down_proj"} & {
        s.hf_module for s in all_sites if s.hf_param == "gate_up_proj"
    }
    return {
        s.key: PEFT_PREFIX
        + s.hf_module
        + (".base_layer" if s.hf_param == "gate_up_proj" and s.hf_module in both else "")
        for s in all_sites
    }


def to_peft(all_sites: list[Site], tensors: dict) -> dict:
    """torchtitan adapter tensors ({key}.lora_A/B) -> PEFT's file. Experts: A [E, r, in] -> [E*r, in] (expert
    major), B [E, out, r] -> [out, r*E] (PEFT reads it as reshape(out, r, E))."""
    out = {}
    for site in all_sites:
        a, b = tensors[f"{site.key}.lora_A"], tensors[f"{site.key}.lora_B"]
        if site.hf_param:
            a, b = a.reshape(-1, a.shape[-1]), b.permute(1, 2, 0).reshape(b.shape[1], -1)
        prefix = peft_names(all_sites)[site.key]
        out[f"{prefix}.lora_A.weight"], out[f"{prefix}.lora_B.weight"] = a.contiguous(), b.contiguous()
    return out


def from_peft(all_sites: list[Site], tensors: dict, shapes: dict) -> dict:
    """PEFT's file -> torchtitan adapter tensors of `shapes` ({key}.lora_A/B: torch.Size); LoRAError on a miss."""
    out, prefixes = {}, peft_names(all_sites)
    for site in all_sites:
        names = [f"{prefixes[site.key]}.lora_{x}.weight" for x in "AB"]
        missing = [name for name in names if name not in tensors]
        if missing:
            raise LoRAError(f"the adapter has no {missing[0]}: it was not trained on this model's modules")
        a, b = (tensors[name] for name in names)
        a_shape, b_shape = shapes[f"{site.key}.lora_A"], shapes[f"{site.key}.lora_B"]
        if site.hf_param:
            experts, rank, out_features = b_shape[0], b_shape[2], b_shape[1]
            a, b = a.reshape(a_shape), b.reshape(out_features, rank, experts).permute(2, 0, 1)
        if a.shape != a_shape or b.shape != b_shape:
            raise LoRAError(f"{names[0]} has shape {tuple(a.shape)} where this model's adapter has {tuple(a_shape)}")
        out[f"{site.key}.lora_A"], out[f"{site.key}.lora_B"] = a, b
    return out


def delta(site: Site, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """s B A in the base weight's layout, computed as PEFT's merge does it (so a merge here equals its merge)."""
    if not site.hf_param:
        return (b @ a) * scale  # peft.tuners.lora.Linear.get_delta_weight
    # peft.tuners.lora.ParamWrapper.get_delta_weight, on its own layout, for (experts, out, in) parameters
    return torch.einsum("o r e, e r i -> e o i", b.permute(1, 2, 0), a) * scale


def merge(all_sites: list[Site], states: dict, scale: float) -> dict:
    """The gathered state dict with each adapter's update added to its base weight(s), adapters removed."""
    merged = {key: value for key, value in states.items() if not adapters.is_adapter_key(key)}
    for site in all_sites:
        update = delta(site, states[f"{site.key}.lora_A"].float(), states[f"{site.key}.lora_B"].float(), scale)
        rows = update.shape[-2] // len(site.base)  # gate_up: w1 then w3
        for i, key in enumerate(site.base):
            merged[key] = merged[key].float() + update[..., i * rows : (i + 1) * rows, :]
    return merged


# ---- adapter_config.json ---------------------------------------------------------------------------------------


def adapter_config(all_sites: list[Site], settings: Lora, base: str) -> dict:
    """What PEFT's LoraConfig needs to rebuild the adapter (it fills every other field with its defaults)."""
    modules = sorted({s.hf_module.rsplit(".", 1)[1] for s in all_sites if not s.hf_param})
    parameters = sorted({f"mlp.experts.{s.hf_param}" for s in all_sites if s.hf_param})
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": settings.rank,
        "lora_alpha": settings.alpha or 2 * settings.rank,
        "lora_dropout": settings.dropout,
        "target_modules": modules,
        "target_parameters": parameters or None,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
    }


def adapter_settings(folder: str) -> Lora:
    """The LoRA settings of a PEFT adapter folder (as the `--lora` section that trains it); LoRAError (one line) for
    one this image cannot continue."""
    path = os.path.join(folder, ADAPTER_CONFIG)
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as error:
        raise LoRAError(f"INIT_FROM={folder}: cannot read {ADAPTER_CONFIG}: {error}") from None
    unsupported = [
        name
        for name in (
            "use_dora",
            "use_rslora",
            "fan_in_fan_out",
            "modules_to_save",
            "layers_to_transform",
            "rank_pattern",
            "alpha_pattern",
        )
        if config.get(name)
    ]
    if config.get("peft_type") != "LORA" or config.get("bias", "none") != "none" or unsupported:
        raise LoRAError(
            f"INIT_FROM={folder}: a {config.get('peft_type')} adapter with "
            f"{', '.join(unsupported) or 'bias=' + str(config.get('bias'))}: this image continues plain "
            "LoRA only"
        )
    modules = config.get("target_modules") or []
    modules = [modules] if isinstance(modules, str) else modules
    parameters = ["experts." + name.rsplit(".", 1)[-1] for name in config.get("target_parameters") or []]
    try:
        found = Lora(
            rank=int(config["r"]),
            alpha=float(config["lora_alpha"]),
            dropout=float(config.get("lora_dropout") or 0.0),
            targets=",".join(modules + parameters),
        )
    except (KeyError, TypeError, ValueError) as error:  # ValueError: also a value the section refuses
        raise LoRAError(
            f"INIT_FROM={folder}: {ADAPTER_CONFIG} has no usable r, lora_alpha, lora_dropout "
            f"({type(error).__name__}: {error})"
        ) from None
    if not found.rank:  # the section's rank 0 is full fine-tuning: no adapter
        raise LoRAError(f"INIT_FROM={folder}: {ADAPTER_CONFIG} has r=0, an adapter of no rank")
    return found


def adapter_base(folder: str, assets: str) -> str:
    """The base model folder of a PEFT adapter folder. PEFT names it in `base_model_name_or_path`: a path (absolute,
    or relative to the adapter folder), or a Hub id, looked for where INIT_FROM=hub puts a model's weights: beside
    the run's assets folder (`assets`, ASSETS_DIR/<repo name>), under its repo name."""
    with open(os.path.join(folder, ADAPTER_CONFIG)) as f:
        name = json.load(f).get("base_model_name_or_path")
    if not isinstance(name, str) or not name:
        raise LoRAError(f"INIT_FROM={folder}: its {ADAPTER_CONFIG} names no base model (base_model_name_or_path)")
    local = os.path.join(folder, name)  # an absolute name stays as it is
    if os.path.isdir(local):
        return os.path.abspath(local)
    hub = os.path.join(os.path.dirname(os.path.abspath(assets or ".")), name.rsplit("/", 1)[-1])
    if HUB_ID.fullmatch(name) and os.path.isdir(hub):
        return hub
    raise LoRAError(
        f"INIT_FROM={folder}: its base model {name!r} is not a folder here"
        + (f" (nor at {hub})" if HUB_ID.fullmatch(name) else "")
    )


def shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def is_adapter_folder(path: str | None) -> bool:
    return bool(path) and os.path.isfile(os.path.join(path, ADAPTER_CONFIG))


def settings(config) -> Lora | None:
    """The run's LoRA settings: the `--lora` section; None: full fine-tuning (rank 0). An initial load that names a
    PEFT adapter folder continues that adapter: its adapter_config.json gives the settings (`adapter` naming it), and
    `--lora.*` values that differ from the adapter's are refused (LoRAError). Reads, changes nothing."""
    source, section = config.checkpoint.initial_load_path, config.lora
    if not (config.checkpoint.initial_load_in_hf and is_adapter_folder(source)):
        return section if section.rank else None
    saved = adapter_settings(source)
    given = {
        "LORA_RANK": section.rank or None,
        "LORA_ALPHA": section.alpha or None,
        "LORA_DROPOUT": section.dropout or None,
        "LORA_TARGETS": ",".join(sorted(section.names)) or None,
    }
    has = {
        "LORA_RANK": saved.rank,
        "LORA_ALPHA": saved.alpha,
        "LORA_DROPOUT": saved.dropout,
        "LORA_TARGETS": ",".join(sorted(saved.names)),
    }
    differs = [
        f"{name}={shown(value)} (the adapter's: {shown(has[name])})"
        for name, value in given.items()
        if value is not None and value != has[name]
    ]
    if differs:
        raise LoRAError(f"INIT_FROM={source}: {', '.join(differs)}: unset them to continue the adapter as it is")
    return replace(saved, adapter=source)


def resolve(config) -> Lora | None:
    """`settings`, and with an adapter folder its base as the initial load in place of the adapter and its settings
    as the `--lora` section (`config` is changed in place: call this once)."""
    found = settings(config)
    if found and found.adapter:
        config.checkpoint.initial_load_path = adapter_base(found.adapter, config.hf_assets_path)
        config.lora = found
    return found


def load_adapter(trainer, folder: str) -> None:
    """Continue from a PEFT adapter: its tensors into the (sharded) adapters, every rank reading the small file."""
    from safetensors.torch import load_file

    params = {
        f"{a.site.key}.lora_{x}": getattr(a, f"lora_{x}")
        for part in trainer.model_parts
        for a in adapters.adapters(part)
        for x in "AB"
    }
    full = from_peft(
        sites(trainer), load_file(os.path.join(folder, ADAPTER_WEIGHTS)), {key: p.shape for key, p in params.items()}
    )
    with torch.no_grad():
        for key, param in params.items():
            value = full[key].to(device=param.device, dtype=param.dtype)
            if isinstance(param, DTensor):  # every rank read it whole: no scatter from rank 0 (not in the census)
                value = distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)
            param.copy_(value)
    logger.info(f"LoRA: continuing the adapter of {folder} ({len(params) // 2} adapters)")


# ---- the export ------------------------------------------------------------------------------------------------


def _write_adapter(folder: str, tensors: dict, config: dict, tokenizer: list) -> None:
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    with open(os.path.join(folder, ADAPTER_CONFIG), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    for path in tokenizer:
        shutil.copyfile(path, os.path.join(folder, os.path.basename(path)))


def _whole(value) -> torch.Tensor:
    return (value.full_tensor() if isinstance(value, DTensor) else value).detach()


def gather_adapters(trainer) -> dict:
    """The adapters' tensors whole, on the CPU (every rank takes part; they are small)."""
    return {
        key: _whole(value).to("cpu")
        for piece in shards.state_dict_pieces(trainer.model_parts, keep=adapters.is_adapter_key)
        for key, value in piece().items()
    }


def merged_pieces(trainer, all_sites: list[Site], scale: float) -> list:
    """shards.state_dict_pieces with each adapter's update added to its base weight(s), the adapters left out:
    a layer at a time, its adapted weights whole (every rank gathers them, in one order), the others as they are."""
    by_key = {site.key: site for site in all_sites}

    def merged(piece):
        states = piece()
        here = sorted({key.rsplit(".", 1)[0] for key in states if adapters.is_adapter_key(key)})
        needed = sorted({key for site in here for key in (*by_key[site].base, f"{site}.lora_A", f"{site}.lora_B")})
        updated = merge([by_key[site] for site in here], {key: _whole(states[key]) for key in needed}, scale)
        return {key: updated.get(key, value) for key, value in states.items() if not adapters.is_adapter_key(key)}

    return [functools.partial(merged, piece) for piece in shards.state_dict_pieces(trainer.model_parts)]


def export(trainer, settings: Lora) -> str | None:
    """`--export.dir`, if set: the PEFT adapter folder, or (`--export.merged`) the merged model, streamed as
    weights.export streams any model, with the adapter in `<dir>/adapter`. Every rank must call it; the folder is
    staged and renamed into place (write.staged: on a failure on any rank, every rank raises ExportError)."""
    section = trainer.config.export
    if not section.dir:
        return None
    target, dtype = os.path.abspath(section.dir), TORCH_DTYPE_MAP[section.dtype]
    all_sites, base = sites(trainer), trainer.checkpointer.states[BASE_STATE].folder
    peft = {key: value.to(dtype).contiguous() for key, value in to_peft(all_sites, gather_adapters(trainer)).items()}
    tokenizer = [
        path
        for path in weights.companions(base, trainer.config.hf_assets_path)
        if os.path.basename(path) in weights.TOKENIZER_FILES
    ]
    ranks = write.Ranks()
    try:
        with write.staged(ranks, target) as staging:
            folder = staging
            if section.merged:
                write.write_model(
                    ranks,
                    staging,
                    weights._adapter(trainer),
                    merged_pieces(trainer, all_sites, settings.scale),
                    dtype,
                    section.max_shard_mb * 10**6,
                )
                ranks.on_rank_0(
                    weights.fill_folder,
                    staging,
                    weights.model_config_json(trainer, base, dtype),
                    weights.companions(base, trainer.config.hf_assets_path),
                )
                folder = os.path.join(staging, MERGED_ADAPTER)
            ranks.on_rank_0(_write_adapter, folder, peft, adapter_config(all_sites, settings, base), tokenizer)
    finally:
        ranks.close()
    logger.info(
        f"Exported the LoRA adapter ({len(all_sites)} adapters, {dtype})"
        f"{' and the merged model' if section.merged else ''} to {target}"
    )
    return target
