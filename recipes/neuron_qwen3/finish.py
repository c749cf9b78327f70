"""`finish`: the one place a config is completed with every setting derived from it, the world and the device.

A config function returns what the user chose (its values, then the flags); what follows from those choices is
derived here, once: float32 on CPU, the NKI experts' kwargs, the attention without Inductor, Hugging Face
compatibility, LoRA, the MoE routers' loss coefficient and freeze, the tokenizer folder, GRPO's batch of prompts,
the validation split, EPOCHS' steps, the fine-tuning learning rate and warm-up, the global batch. The pre-launch
pass (prelaunch/preflight.py) and every worker (trainer.RunHooks) call it on the same parsed flags, and nothing
writes the config after it, so `--dry-run` prints exactly what the workers train (the run report keeps the
workers' copy: report/config.json).
"""

import copy
import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from neuron_qwen3 import data, neuron_sdk, shapes
from neuron_qwen3.hf import rope as hf_rope
from neuron_qwen3.hf import weights
from neuron_qwen3.lora import adapters, folders, targets
from neuron_qwen3.moe import routing
from neuron_qwen3.run import tuning
from neuron_qwen3.settings import Lora

# The override.imports entry that swaps the nki_moe experts (moe/experts.py), named without importing it: a
# torchtitan without the override registry still runs the other variants.
NKI_EXPERTS = "neuron_qwen3.moe.experts.nki_grouped_experts"
DOCUMENT_ATTENTION = "neuron_qwen3.attention.document.document_attention"  # the same for native's attention

CPU_FLOAT32 = (
    "precision: float32 (--training.mixed_precision_param float32{experts}): full scale on CPU, where "
    "bf16 matmuls are emulated; --no-cpu_float32 keeps the config's"
)


@dataclass
class Finished:
    """What finishing found besides the config: the lines saying what it derived, LoRA's settings (the config's
    `--lora` section; None: full fine-tuning), EPOCHS' plan, whether document attention replaced flex (the data
    step then builds its masks)."""

    lines: list = field(default_factory=list)
    lora: Lora | None = None
    plan: object = None  # data.epochs.Plan, with EPOCHS
    document_attention: bool = False


def _nki_entries(overrides):
    """(index, kwargs) of each override entry that swaps in the NKI experts."""
    for i, entry in enumerate(overrides.imports):
        target, kwargs = (entry, {}) if isinstance(entry, str) else entry
        if target == NKI_EXPERTS:
            yield i, kwargs


def cpu_float32(config, kind: str, typed: set = frozenset()) -> str | None:
    """On CPU (`kind`, the device the worker trains on), a full-scale config computes in float32, as the bench
    configs do on CPU, unless --training.mixed_precision_param is in `typed`; a config of the user's own (no
    report.scale) decides its own. Unless nkilib's kernels compute them (they take bf16), a run computing in float32
    (so, or by --training.mixed_precision_param float32) has its nki_moe experts compute in float32 too: they cast
    to bf16 themselves otherwise. Returns the line that says what full scale on CPU changed, or None."""
    full_on_cpu = (
        kind == "cpu"
        and config.report.scale == "full"
        and config.cpu_float32
        and "training.mixed_precision_param" not in typed
    )
    if full_on_cpu:
        config.training.mixed_precision_param = "float32"
    experts = ""
    kernel = config.neuron.moe_kernel
    on_kernels = neuron_sdk.kernel_path(kernel, kind) == "nki"
    if not on_kernels and config.training.mixed_precision_param == "float32":
        for i, kwargs in list(_nki_entries(config.override)):
            config.override.imports[i] = (NKI_EXPERTS, {**kwargs, "compute_dtype": "float32"})
            experts = ", nki_moe experts compute_dtype float32"
    return CPU_FLOAT32.format(experts=experts) if full_on_cpu else None


def configure_nki_experts(overrides, neuron) -> None:
    """Give the NKI experts override the run's kernel choice and LNC (`--neuron.*`), unless its entry sets them."""
    for i, kwargs in list(_nki_entries(overrides)):
        overrides.imports[i] = (
            NKI_EXPERTS,
            {"kernel": neuron.moe_kernel, "logical_nc_config": neuron.logical_nc_config, **kwargs},
        )


def configure_attention(config, kind: str) -> str | None:
    """On Neuron, or with `--neuron.attention_kernel` nki or reference, document attention (attention/) in place of
    torchtitan's flex attention, which needs Inductor: for torchtitan's models through the override registry, for
    the transformers model (v5) through transformers' attention interface. Returns the line saying so, or None."""
    from neuron_qwen3.attention import document

    neuron = config.neuron
    if not document.replaces_flex(neuron.attention_kernel, kind):
        return None
    settings = {"kernel": neuron.attention_kernel, "logical_nc_config": neuron.logical_nc_config}
    if hasattr(config.model_spec.model, "layers"):  # torchtitan's Decoder
        kept = [e for e in config.override.imports if (e if isinstance(e, str) else e[0]) != DOCUMENT_ATTENTION]
        config.override.imports = [*kept, (DOCUMENT_ATTENTION, settings)]
    else:
        model = copy.deepcopy(config.model_spec.model)  # the backend's flavors are shared by every spec it builds
        document.use_in_transformers(model, neuron.attention_kernel, neuron.logical_nc_config)
        model.attn_implementation = document.ATTENTION_NAME  # what transformers' config is loaded with
        config.model_spec.model = model
    path = neuron_sdk.kernel_path(neuron.attention_kernel, kind)
    if path == "nki":
        check_attention_kernel_shapes(config, kind)
    return f"attention: document-causal, {'nkilib kernels' if path == 'nki' else 'PyTorch reference'} (no Inductor)"


def check_attention_kernel_shapes(config, kind: str) -> None:
    """nkilib's attention kernels run only on Neuron and take only some shapes: one line before launch (ValueError)."""
    from neuron_qwen3.attention import nki_kernels

    if kind != "neuron":
        raise ValueError(
            f"NEURON_QWEN3_ATTENTION_KERNEL=nki (--neuron.attention_kernel) needs a neuron device, and this run is on "
            f"{kind} (allowed here: auto, reference)"
        )
    shape = shapes.of_run(config)
    if shape is None:
        return  # v5 before the asset fetch: the workers check it, and the kernels' own asserts stand behind
    nki_kernels.check_kernel_shapes(shape.head_dim, config.training.seq_len, config.neuron.logical_nc_config)


def rope_source(config) -> tuple:
    """(folder, its name) whose config.json defines the model a run trains: INIT_FROM's (after folders.resolve,
    a LoRA adapter's base), else the full-scale assets (the Hub's config.json); (None, None) at smoke scale."""
    if config.checkpoint.initial_load_in_hf and config.checkpoint.initial_load_path:
        return config.checkpoint.initial_load_path, "INIT_FROM"
    if config.hf_assets_path and os.path.isfile(os.path.join(config.hf_assets_path, "config.json")):
        return config.hf_assets_path, "ASSETS_DIR"
    return None, None


def configure_rope(config) -> str | None:
    """The RoPE of the model folder the run trains (rope_source), else the one MODEL was released with
    (shapes.RELEASED_ROPE), in place of the config's: torchtitan's flavors all build theta 1,000,000. Returns the
    line saying what changed, or None. Raises hf.rope.RopeError (a ValueError) for a RoPE not reproduced here."""
    folder, name = rope_source(config)
    rope = hf_rope.of_folder(folder, name) if folder else None
    where = f"{name}'s config.json"
    if rope is None and config.report.model in shapes.RELEASED_ROPE:
        rope, where = hf_rope.Rope(*shapes.RELEASED_ROPE[config.report.model]), f"{config.report.model} as released"
    model = config.model_spec.model
    if rope is None or (not hasattr(model, "layers") and name != "INIT_FROM"):  # v5 reads its hf_model's otherwise
        return None
    if hasattr(model, "layers"):  # torchtitan's Decoder: each attention's RoPE, which torchtitan sizes to seq_len
        built = model.layers[0].attention.rope
        was = hf_rope.Rope(built.theta, built.max_seq_len)
        for layer in model.layers:
            layer.attention.rope = dataclasses.replace(
                layer.attention.rope, theta=rope.theta, max_seq_len=rope.positions
            )
    else:
        from neuron_qwen3.quirks import hf_rope_fix

        was = hf_rope.of_folder(config.hf_model, "--hf_model")
        config.model_spec.model = hf_rope_fix.with_rope(model, rope.theta, rope.positions)
    return (
        None
        if was == rope
        else f"rope: {rope.describe()}, from {where} (the config builds {was.describe() if was else 'another'})"
    )


def configure_validation(config) -> None:
    """VALIDATION (`--dataloader.validation`): torchtitan's validator over the whole validation set, with the
    project's loader of it (every rank its share, equal batches), every `--validator.freq` steps."""
    loader = config.dataloader
    if loader.validation:
        held_out = dataclasses.replace(loader, split="validation", infinite=False, epochs=0)
        config.validator = dataclasses.replace(config.validator, enable=True, steps=-1, dataloader=held_out)


def configure_router(config) -> None:
    """MOE_AUX_LOSS unset: the coefficient Qwen3-MoE trains with, INIT_FROM's router_aux_loss_coef (as transformers
    and TRL read it), else 0.001; a dense model: 0. MOE_ROUTER=freeze: the routers frozen after parallelizing
    (in place, as LoRA's adapters are, for the same reason). The coefficients' range: settings.Moe."""
    moe = config.moe
    if targets.family_of(config.model_spec.model) != "moe":
        moe.aux_loss = 0.0 if moe.aux_loss is None else moe.aux_loss
        return
    if moe.aux_loss is None:
        source = config.checkpoint.initial_load_path if config.checkpoint.initial_load_in_hf else None
        path = os.path.join(source, "config.json") if source else ""
        found = json.loads(Path(path).read_text()).get("router_aux_loss_coef") if os.path.isfile(path) else None
        moe.aux_loss = float(found) if found is not None else routing.QWEN3_MOE_AUX
    if moe.router == "freeze":
        spec = config.model_spec
        spec.parallelize_fn = routing.wrap_parallelize(spec.parallelize_fn)


def configure_preference(config, lora) -> str | None:
    """METHOD=dpo: the reference resolved (DPO_REFERENCE; else with LoRA the base, adapters off; else INIT_FROM's
    folder, frozen) and the line that says so; None under SFT. Beta's and the SFT weight's range: settings.py."""
    settings = config.preference
    if settings.method != "dpo":
        return None
    if config.training.seq_len % 2:
        raise ValueError(
            f"--training.seq_len={config.training.seq_len}: DPO packs pairs into windows of an even length"
        )
    if not settings.reference and not lora:
        if not (config.checkpoint.initial_load_in_hf and config.checkpoint.initial_load_path):
            raise ValueError(
                "METHOD=dpo needs a reference model: INIT_FROM (its weights, frozen), LORA_RANK (the "
                "base with the adapters off) or DPO_REFERENCE (a model folder)"
            )
        settings.reference = config.checkpoint.initial_load_path
    return (
        f"dpo: {settings.loss} loss, beta {settings.beta:g}"
        + (f", SFT term x {settings.sft_weight:g}" if settings.sft_weight else "")
        + ", reference "
        + (settings.reference or "the base model (LoRA adapters off)")
        + (", its log-probabilities computed in one pass at the first step" if settings.precompute else "")
    )


def configure_grpo(config, lora, world: int) -> str | None:
    """METHOD=grpo: the rewards named, the room for a prompt beside GRPO_MAX_COMPLETION, whole groups in each
    rank's step, the prompts a loader batch holds (a step's on each rank), and with GRPO_BETA above 0 the reference
    (as DPO's). Returns the line that says so; None under another method. The values' ranges: settings.Grpo."""
    g = config.grpo
    if config.preference.method != "grpo":
        return None
    if not g.rewards.strip():
        raise ValueError("METHOD=grpo needs GRPO_REWARDS (--grpo.rewards): accuracy, format, length or module:function")
    room = config.training.seq_len - g.max_completion
    if room < 16:
        raise ValueError(
            f"--training.seq_len={config.training.seq_len} leaves {room} prompt tokens beside GRPO_MAX_COMPLETION="
            f"{g.max_completion}: at least 16 are needed"
        )
    wanted, per_step = tuning.batch(config, world)
    local, micro_steps = config.training.local_batch_size, wanted // per_step
    if local * micro_steps % g.generations:
        raise ValueError(
            f"BATCH_SIZE={wanted} gives each rank {local * micro_steps} completions a step (local batch {local} x "
            f"{micro_steps} micro-steps), not a multiple of GRPO_GENERATIONS={g.generations}: a BATCH_SIZE that is "
            f"a multiple of {math.lcm(g.generations, local) * per_step // local}, or other generations"
        )
    if config.dataloader.epochs:
        raise ValueError(
            f"EPOCHS={config.dataloader.epochs} under METHOD=grpo: a GRPO run is counted in steps (STEPS), each "
            "drawing its prompts afresh"
        )
    if g.beta and not config.preference.reference and not lora:
        if not (config.checkpoint.initial_load_in_hf and config.checkpoint.initial_load_path):
            raise ValueError(
                "GRPO_BETA above 0 needs a reference model: INIT_FROM (its weights, frozen), LORA_RANK (the base "
                "with the adapters off) or DPO_REFERENCE (a model folder)"
            )
        config.preference.reference = config.checkpoint.initial_load_path
    config.dataloader.prompts = local * micro_steps // g.generations
    reference = (config.preference.reference or "the base model (LoRA adapters off)") if g.beta else "none"
    return (
        f"grpo: {g.loss} loss, {config.dataloader.prompts} prompts x {g.generations} generations a step on each "
        f"rank, up to {g.max_completion} tokens at temperature {g.temperature:g}, rewards {g.rewards}, beta "
        f"{g.beta:g} (reference {reference}), {g.iterations} iteration(s) per generation"
    )


def data_parallel(config, world: int) -> int:
    """The data-parallel degree of `config.parallelism` on `world` ranks, as torchtitan's Trainer derives it."""
    from torchtitan.distributed import ParallelDims

    dims = ParallelDims.from_config(config.parallelism, world)
    return dims.dp_replicate * dims.dp_shard


def finish(config, world: int, kind: str, typed: set = frozenset()) -> Finished:
    """Complete `config` in place for `world` ranks training on `kind` (cpu, cuda, neuron); a flag in `typed`
    (tuning.typed_flags of the command line) keeps its value over a derived default. Raises LoRAError
    (an adapter's settings), DataError (EPOCHS over a bad record) or ValueError (what the flags leave to finishing,
    e.g. an odd DPO seq_len: each section checked its own values when it was built, settings.py)."""
    done = Finished()
    precision = cpu_float32(config, kind, typed)
    done.lines += [precision] if precision else []
    configure_nki_experts(config.override, config.neuron)
    attention = configure_attention(config, kind)
    done.lines += [attention] if attention else []
    done.document_attention = attention is not None
    weights.hf_compatible(config)  # before the model is built
    done.lora = folders.resolve(config)  # an initial load naming a PEFT adapter: its base is loaded instead
    if done.lora:
        adapters.adapt_model_spec(config, done.lora)  # adapters in before parallelize_fn, the base frozen after
    rope = configure_rope(config)  # after resolve too: INIT_FROM is then the base model's folder
    done.lines += [rope] if rope else []
    configure_router(config)  # after resolve: INIT_FROM is then the base model's folder
    if kind == "cpu":  # last: the init it wraps includes the adapters'
        from neuron_qwen3.quirks import cpu_adapter

        config.model_spec.parallelize_fn = cpu_adapter.whole_draws_at_init(config.model_spec.parallelize_fn)
    preference = configure_preference(config, done.lora)  # after resolve too
    done.lines += [preference] if preference else []
    if isinstance(config.dataloader, data.DataLoader.Config):
        config.dataloader.tokenizer_folder = data.tokenizer_of(config)  # the chat template of the model trained
        grpo = configure_grpo(config, done.lora, world)  # before EPOCHS, which it refuses
        done.lines += [grpo] if grpo else []
        configure_validation(config)
        if config.dataloader.epochs:
            done.plan = data.epochs.plan(config, data_parallel(config, world))
            config.training.steps = done.plan.steps
            done.lines += [f"epochs: {done.plan.line}", *[done.plan.cache_line] * (done.plan.cache is not None)]
    done.lines += tuning.apply(config, typed)  # after EPOCHS: the warm-up may be a fraction of the steps
    config.training.global_batch_size = tuning.batch(config, world)[0]  # -1 resolved as torchtitan resolves it
    return done
