"""LoRA on all three variants: adapters beside frozen Qwen3 weights, named as PEFT names them.

torchtitan 0.3.0's LoRAConverter rewrites `Linear.Config`s: it cannot reach the transformers backend's modules (built
by transformers), torchtitan's stacked MoE experts (three 3-D parameters, not Linears) or the fused QKV projection
as Hugging Face's separate q/k/v, and it has no export. Here the adapters go into the BUILT model, on the meta
device, by `wrap_parallelize` just before the model spec's own parallelize function, so AC, torch.compile and
fully_shard treat them as any other weight of their block. Each adapter is one `LoRA` module (a torchtitan Module)
whose state-dict keys end in `.lora_A` / `.lora_B`, and it records its `Site`: the Hugging Face module PEFT would
adapt and the torchtitan weights its update adds to (for the export, the merge and an adapter loaded back).

    dense Linear (o_proj, MLP; v5: every projection): y = W x + s B A dropout(x),     s = alpha / rank
    fused QKV (native, nki_moe): one adapter per q, k, v, added to that head group's output
    routed experts [E, F, D] (nki_moe): W_e + s B_e A_e for each expert e, computed in front of the experts' own
        (NKI or grouped-mm) computation; gate and up share A as in transformers' fused `gate_up_proj`

A is initialised as PEFT does (kaiming-uniform, a = sqrt(5), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in))), B to zeros,
so the first step computes the base model exactly. On CPU every rank draws A whole (quirks/cpu_adapter.py's
WholeDraws): a run's initial adapters do not depend on its number of ranks. Every other weight is frozen after
parallelisation: the optimizer, which takes only trainable parameters, holds adapter state only, and no base weight
gets a gradient.
Tensor, expert and pipeline parallelism are refused (FSDP only, as every config here trains).
"""

import math
from dataclasses import dataclass

import spmd_types as spmd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torchtitan.models.common.attention import FusedQKVLinear
from torchtitan.models.common.decoder_sharding import dense_param_placement
from torchtitan.models.common.moe import GroupedExperts
from torchtitan.protocols.module import Module
from torchtitan.protocols.sharding import ShardingConfig
from torchtitan.tools.logging import logger

from neuron_qwen3.moe.experts import NKIGroupedExperts
from neuron_qwen3.lora.targets import LoRAError, family_of, target_problems, targets_of
from neuron_qwen3.settings import Lora

ADAPTER_SUFFIXES = (".lora_A", ".lora_B")
# ---- the adapter module ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Site:
    """Where one adapter sits, in both namings."""

    key: str  # the LoRA module's state-dict prefix in the torchtitan model
    hf_module: str  # the module PEFT adapts in the transformers model, e.g. model.layers.0.self_attn.q_proj
    base: tuple[str, ...]  # torchtitan state-dict keys of the weights its update adds to, in row order
    hf_param: str | None = None  # experts: the 3-D parameter PEFT's target_parameters names (gate_up_proj, ...)


class LoRA(Module):
    """A (rank x in) and B (out x rank), per expert when `experts`; scale = alpha / rank."""

    @dataclass(kw_only=True, slots=True)
    class Config(Module.Config):
        in_features: int
        out_features: int
        rank: int
        scale: float
        dropout: float = 0.0
        experts: int = 0  # 0: one Linear; E: a stack of E (A [E, r, in], B [E, out, r])

    def __init__(self, config: Config):
        super().__init__()
        stack = (config.experts,) if config.experts else ()
        self.lora_A = nn.Parameter(torch.empty(*stack, config.rank, config.in_features))
        self.lora_B = nn.Parameter(torch.empty(*stack, config.out_features, config.rank))
        self.scale = config.scale
        self.fan_in = config.in_features
        self.dropout = nn.Dropout(config.dropout) if config.dropout else nn.Identity()
        self.site: Site | None = None

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """PEFT's init: kaiming_uniform_(A, a=sqrt(5)) over each (rank x in) block is U(+-1/sqrt(in)); B = 0.
        Without DTensor's RNG tracker (CPU) A is drawn from `generator`, a host generator (None: the default one),
        whole under the CPU adapter's WholeDraws: the same draw whatever the number of ranks."""
        bound = 1 / math.sqrt(self.fan_in)
        nn.init.uniform_(self.lora_A, -bound, bound, generator=None if _rng_tracked(self.lora_A) else generator)
        nn.init.zeros_(self.lora_B)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B) * self.scale

    def delta(self, rows: slice = slice(None)) -> torch.Tensor:
        """s B A of the stacked experts, [E, out, in] (`rows`: a slice of out)."""
        return torch.bmm(self.lora_B[:, rows], self.lora_A) * self.scale


def _rng_tracked(tensor: torch.Tensor) -> bool:
    """Whether DTensor draws a random op on `tensor` whole, through its RNG tracker. torch keeps one only for a device
    whose module sets its RNG state: CUDA, the simulated neuron device, not CPU (the test of the private
    torch.distributed.tensor._random.is_rng_supported_mesh, here without its warning). A plain tensor there is drawn
    whole as before."""
    return tensor.is_meta or hasattr(torch.get_device_module(tensor.device), "set_rng_state")


def _shared_generator() -> torch.Generator:
    """A host generator seeded from the default one's state before the base's init (torchtitan seeds it alike on
    every rank): the adapters' numbers do not depend on what that init draws, which a LoRA run then overwrites."""
    fork = torch.Generator()
    fork.set_state(torch.get_rng_state())
    return torch.Generator().manual_seed(int(torch.randint(2**62, (), generator=fork)))  # not the base's own numbers


def _lora(beside: torch.Tensor, in_features, out_features, settings: Lora, experts=0) -> LoRA:
    """An adapter on the device and in the dtype of the weight `beside` it (meta, when the trainer parallelizes)."""
    replicated = dense_param_placement(tp=spmd.R)  # FSDP shards it with its block; no TP (refused)
    with torch.device(beside.device):
        adapter = LoRA.Config(
            in_features=in_features,
            out_features=out_features,
            rank=settings.rank,
            scale=settings.scale,
            dropout=settings.dropout,
            experts=experts,
            sharding_config=ShardingConfig(state_shardings={"lora_A": replicated, "lora_B": replicated}),
        ).build()
    return adapter.to(beside.dtype)


# ---- the adapted modules: the base class with the adapter added, swapped onto the built instance -------------

_adapted_classes: dict[type, type] = {}


def _adapted(cls: type, body: dict) -> type:
    """`cls` with `body`'s methods, one class per base class (compile and FSDP see a fixed type)."""
    if cls not in _adapted_classes:
        _adapted_classes[cls] = type(f"LoRA{cls.__name__}", (cls,), {"_lora_base": cls, **body})
    return _adapted_classes[cls]


def _linear_forward(self, x):
    return self._lora_base.forward(self, x) + self.lora(x)


def _qkv_forward(self, x):
    xq, xk, xv = self._lora_base.forward(self, x)
    out = []
    for name, heads in (("lora_q", xq), ("lora_k", xk), ("lora_v", xv)):
        adapter = self._modules.get(name)
        out.append(heads if adapter is None else heads + adapter(x).view_as(heads))
    return tuple(out)


def _expert_weights(self):
    """NKIGroupedExperts.expert_weights with each adapter's update added, W_e + s B_e A_e (gate and up: the two
    halves of lora_gate_up's rows). Not properties under the parameters' names: FSDP reads a parameter back by
    its name (getattr), and a property there handed it the merged tensor, which became the base parameter."""
    w1, w2, w3 = self._lora_base.expert_weights(self)
    gate_up, down = self._modules.get("lora_gate_up"), self._modules.get("lora_down")
    if gate_up is not None:
        half = gate_up.lora_B.shape[1] // 2
        w1, w3 = w1 + gate_up.delta(slice(None, half)), w3 + gate_up.delta(slice(half, None))
    if down is not None:
        w2 = w2 + down.delta()
    return w1, w2, w3


def _install(module: nn.Module, body: dict, adapters: dict) -> None:
    """`module` becomes its adapted class (`body`'s methods), with `adapters` as its children."""
    module.__class__ = _adapted(type(module), body)
    for child, adapter in adapters.items():
        module.add_module(child, adapter)


# ---- where the adapters go, per variant ----------------------------------------------------------------------


def _layers(model: nn.Module):
    """(torchtitan prefix, Hugging Face prefix, block) of each decoder layer; v5 wraps a transformers model."""
    if hasattr(model, "model") and isinstance(getattr(model.model, "model", None), nn.Module):
        for i, block in enumerate(model.model.model.layers):  # HFTransformerModel: model.model is ...ForCausalLM
            yield f"model.model.layers.{i}", f"model.layers.{i}", block
    else:
        for i, block in model.layers.items():
            yield f"layers.{i}", f"model.layers.{i}", block


def _linear_sites(prefix, hf_prefix, parent, pairs, settings, targets):
    """Adapters on the plain Linear children of `parent`: pairs of (attribute, Hugging Face name)."""
    sites = []
    for attr, hf_name in pairs:
        if hf_name not in targets or getattr(parent, attr, None) is None:
            continue
        linear = getattr(parent, attr)
        adapter = _lora(linear.weight, linear.in_features, linear.out_features, settings)
        hf_path = f"{hf_prefix}.{hf_name}"
        adapter.site = Site(f"{prefix}.{attr}.lora", hf_path, (f"{prefix}.{attr}.weight",))
        _install(linear, {"forward": _linear_forward}, {"lora": adapter})
        sites.append(adapter.site)
    return sites


def _qkv_sites(prefix, hf_prefix, qkv: FusedQKVLinear, settings, targets):
    dim, head = qkv.wqkv.in_features, qkv.head_dim
    kv_heads = qkv.wqkv.out_features // (qkv.r_dim * head)
    adapters = {}
    for name, heads in (("q", kv_heads * qkv.heads_per_kv), ("k", kv_heads), ("v", kv_heads)):
        if f"{name}_proj" in targets:
            adapter = _lora(qkv.wqkv.weight, dim, heads * head, settings)
            adapter.site = Site(f"{prefix}.lora_{name}", f"{hf_prefix}.{name}_proj", (f"{prefix}.w{name}.weight",))
            adapters[f"lora_{name}"] = adapter
    if adapters:
        _install(qkv, {"forward": _qkv_forward}, adapters)
    return [adapter.site for adapter in adapters.values()]


def _expert_sites(prefix, hf_prefix, experts: GroupedExperts, settings, targets):
    if not any(name.startswith("experts.") for name in targets):
        return []
    if not isinstance(experts, NKIGroupedExperts):
        raise LoRAError(
            f"LORA_TARGETS: the experts' adapters compute through nki_moe's experts, and this model's "
            f"are torchtitan's {type(experts).__name__} (use VARIANT=nki_moe, or leave the experts out)"
        )
    count, hidden, dim = experts.w1_EFD.shape
    adapters = {}
    if "experts.gate_up_proj" in targets:
        adapter = _lora(experts.w1_EFD, dim, 2 * hidden, settings, experts=count)
        adapter.site = Site(
            f"{prefix}.lora_gate_up", hf_prefix, (f"{prefix}.w1_EFD", f"{prefix}.w3_EFD"), "gate_up_proj"
        )
        adapters["lora_gate_up"] = adapter
    if "experts.down_proj" in targets:
        adapter = _lora(experts.w2_EDF, hidden, dim, settings, experts=count)
        adapter.site = Site(f"{prefix}.lora_down", hf_prefix, (f"{prefix}.w2_EDF",), "down_proj")
        adapters["lora_down"] = adapter
    if adapters:
        _install(experts, {"expert_weights": _expert_weights}, adapters)
    return [adapter.site for adapter in adapters.values()]


def insert(model: nn.Module, settings: Lora, family: str) -> list[Site]:
    """Put the adapters into `model` (any device, meta included); LoRAError when a target matches nothing."""
    targets = targets_of(settings, family)
    found_problems = target_problems(settings, family)
    if found_problems:
        raise LoRAError(found_problems[0])
    sites = []
    for prefix, hf_prefix, block in _layers(model):
        if hasattr(block, "self_attn"):  # transformers' decoder layer (v5)
            sites += _linear_sites(
                f"{prefix}.self_attn",
                f"{hf_prefix}.self_attn",
                block.self_attn,
                [(n, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")],
                settings,
                targets,
            )
            sites += _linear_sites(
                f"{prefix}.mlp",
                f"{hf_prefix}.mlp",
                block.mlp,
                [(n, n) for n in ("gate_proj", "up_proj", "down_proj")],
                settings,
                targets,
            )
            continue
        attention = block.attention
        if isinstance(attention.qkv_linear, FusedQKVLinear):
            sites += _qkv_sites(
                f"{prefix}.attention.qkv_linear", f"{hf_prefix}.self_attn", attention.qkv_linear, settings, targets
            )
        else:
            sites += _linear_sites(
                f"{prefix}.attention.qkv_linear",
                f"{hf_prefix}.self_attn",
                attention.qkv_linear,
                [("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj")],
                settings,
                targets,
            )
        sites += _linear_sites(
            f"{prefix}.attention", f"{hf_prefix}.self_attn", attention, [("wo", "o_proj")], settings, targets
        )
        if getattr(block, "feed_forward", None) is not None:
            sites += _linear_sites(
                f"{prefix}.feed_forward",
                f"{hf_prefix}.mlp",
                block.feed_forward,
                [("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")],
                settings,
                targets,
            )
        if getattr(block, "moe", None) is not None:
            sites += _expert_sites(
                f"{prefix}.moe.routed_experts.inner_experts",
                f"{hf_prefix}.mlp.experts",
                block.moe.routed_experts.inner_experts,
                settings,
                targets,
            )
    found = {site.hf_param and f"experts.{site.hf_param}" or site.hf_module.rsplit(".", 1)[1] for site in sites}
    missing = [name for name in targets if name not in found]
    if missing:
        raise LoRAError(
            f"LORA_TARGETS: {', '.join(missing)} matches no module of this model "
            f"({type(model).__name__}: adapted {', '.join(sorted(found)) or 'nothing'})"
        )
    return sites


def adapters(model: nn.Module) -> list[LoRA]:
    return [module for module in model.modules() if isinstance(module, LoRA)]


def is_adapter_key(key: str) -> bool:
    return key.endswith(ADAPTER_SUFFIXES)


def freeze_base(model: nn.Module) -> None:
    """Only the adapters train. After parallelisation: torchtitan's state distribution re-creates parameters
    (requires_grad back to True), and FSDP reads requires_grad when it first gathers a parameter."""
    trainable = {id(p) for adapter in adapters(model) for p in adapter.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in trainable)


def wrap_parallelize(parallelize_fn, settings: Lora, family: str):
    """The model spec's parallelize_fn with the adapters put in before it and the base frozen after it."""

    def parallelize(model, *, parallel_dims, **kwargs):
        if parallel_dims.tp_enabled or parallel_dims.ep_enabled or parallel_dims.pp_enabled:
            raise LoRAError(
                f"LoRA here shards with FSDP only; this run has tp={parallel_dims.tp}, "
                f"ep={parallel_dims.ep}, pp={parallel_dims.pp}"
            )
        sites = insert(model, settings, family)
        model = parallelize_fn(model, parallel_dims=parallel_dims, **kwargs)
        freeze_base(model)
        base_init = model.init_states

        def init_states(*, buffer_device=None):
            shared = _shared_generator()
            base_init(buffer_device=buffer_device)
            for adapter in adapters(model):
                adapter.reset_parameters(shared)

        model.init_states = init_states  # the trainer calls it after to_empty; v5's own init skips the adapters
        logger.info(
            f"LoRA: {len(sites)} adapters of rank {settings.rank} (scale {settings.scale:g}) on "
            f"{', '.join(targets_of(settings, family))}; {counts_line(model)}"
        )
        return model

    return parallelize


def counts_line(model: nn.Module) -> str:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return f"{trainable:,} trainable of {total:,} parameters ({100 * trainable / total:.3f}%)"


def adapt_model_spec(config, settings: Lora) -> None:
    """Before the model is built: its model spec parallelizes through `wrap_parallelize`. In place: torchtitan's
    Trainer holds `config.model_spec` from before `init_distributed`, where the config is finished (finish.py)."""
    spec = config.model_spec
    spec.parallelize_fn = wrap_parallelize(spec.parallelize_fn, settings, family_of(spec.model))
