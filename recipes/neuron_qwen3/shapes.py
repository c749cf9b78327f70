"""The one record of Qwen3's shapes: every released flavor, the Hub ids that carry it, the smoke and bench models.

The flavors are torchtitan 0.3.0's `qwen3_configs` (and each Hub repo's config.json; tests build every flavor on
the meta device and compare). Everything else derives from here: the FLOPs count (flops.py), the smoke and bench
model configs (config_registry.py), the bundled config.json files (assets/make_assets.py, checked by a test), the
memory estimate of `--dry-run` and the pre-launch comparison of an INIT_FROM folder.
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int  # the dense MLP's width, or each expert's for MoE
    vocab_size: int = 151936
    tied: bool = False  # lm_head shares the embedding's weight
    num_experts: int = 0  # 0: dense
    top_k: int = 0

    @property
    def family(self) -> str:
        return "moe" if self.num_experts else "dense"

    def parameters(self, active: bool = False) -> int:
        """Parameters of the model; `active`: those one token uses (top_k of the experts)."""
        embeddings = self.vocab_size * self.dim * (1 if self.tied else 2)
        return self.n_layers * self.layer_parameters(active) + embeddings + self.dim  # + the final norm

    def layer_parameters(self, active: bool = False) -> int:
        """Parameters of one decoder block (FSDP's unit)."""
        q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        attention = 2 * self.dim * q + 2 * self.dim * kv + 2 * self.head_dim  # wq, wo, wk, wv + q/k norms
        if self.num_experts:
            experts = self.top_k if active else self.num_experts
            mlp = experts * 3 * self.dim * self.hidden_dim + self.dim * self.num_experts  # + router
        else:
            mlp = 3 * self.dim * self.hidden_dim
        return attention + mlp + 2 * self.dim  # + the two RMSNorms


# torchtitan.models.qwen3.model_registry(flavor) for each key.
FLAVORS = {
    "0.6B": Shape(1024, 28, 16, 8, 128, 3072, tied=True),
    "1.7B": Shape(2048, 28, 16, 8, 128, 6144, tied=True),
    "4B": Shape(2560, 36, 32, 8, 128, 9728, tied=True),
    "8B": Shape(4096, 36, 32, 8, 128, 12288),
    "14B": Shape(5120, 40, 40, 8, 128, 17408),
    "32B": Shape(5120, 64, 64, 8, 128, 25600),
    "30B-A3B": Shape(2048, 48, 32, 4, 128, 768, num_experts=128, top_k=8),
    "235B-A22B": Shape(4096, 94, 64, 4, 128, 1536, num_experts=128, top_k=8),
}
# The repos Qwen publishes for each flavor (the released forms; FP8/GGUF/AWQ copies are not trainable here).
FORMS = {
    "0.6B": ("", "-Base"),
    "1.7B": ("", "-Base"),
    "4B": ("", "-Base", "-Instruct-2507", "-Thinking-2507"),
    "8B": ("", "-Base"),
    "14B": ("", "-Base"),
    "32B": ("",),
    "30B-A3B": ("", "-Base", "-Instruct-2507", "-Thinking-2507"),
    "235B-A22B": ("", "-Instruct-2507", "-Thinking-2507"),
}
MODELS = {f"Qwen/Qwen3-{flavor}{form}": flavor for flavor, forms in FORMS.items() for form in forms}
# torchtitan's flavors build the first release's RoPE (theta 1,000,000 over 40,960 positions). The 2507 forms were
# released with their own (theta, max_position_embeddings); recorded here only where their config.json was read (the
# 4B forms). A model folder's config.json, read when the config is finished (INIT_FROM, or the full-scale assets),
# wins over this record: it serves a config finished before the assets are fetched (--dry-run on a fresh host).
RELEASED_ROPE = dict.fromkeys(("Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen3-4B-Thinking-2507"), (5_000_000.0, 262_144))

# Trained here without the Hub. Smoke: two layers on two CPU cores in seconds, the bundled 2048-token tokenizer;
# the MoE twin's dim and expert width are the smallest the NKI kernels take (H 512, I a multiple of 32 per logical
# core at LNC 2), so CPU runs the very block layout Trainium will. Bench on CPU: Qwen3-0.6B's width at 16 layers
# (0.2B), its MoE twin 0.35B with 0.13B active. Bench on an accelerator: Qwen3-1.7B's shape, its MoE twin 4.2B with
# the dense model's active width.
SMOKE = Shape(128, 2, 4, 2, 32, 384, vocab_size=2048, tied=True)
SMOKE_MOE = Shape(512, 2, 4, 2, 32, 64, vocab_size=2048, num_experts=4, top_k=2)
BENCH_CPU = Shape(1024, 16, 8, 4, 128, 3072, vocab_size=2048, tied=True)
BENCH_CPU_MOE = Shape(1024, 16, 8, 4, 128, 768, vocab_size=2048, num_experts=8, top_k=2)
BENCH = FLAVORS["1.7B"]
BENCH_MOE = Shape(2048, 28, 16, 8, 128, 768, num_experts=32, top_k=8)

ROPE_THETA = 1000000.0
MAX_POSITIONS = 4096  # the smoke and bench models' RoPE cache and config.json limit
HF_MODEL_TYPE = {"dense": "qwen3", "moe": "qwen3_moe"}
HF_ARCHITECTURE = {"dense": "Qwen3ForCausalLM", "moe": "Qwen3MoeForCausalLM"}


def flavor_name(flavor: str) -> str:
    """`30B-A3B` -> `30b_a3b`: how a flavor appears in config function names (native_qwen3_30b_a3b)."""
    return flavor.lower().replace(".", "_").replace("-", "_")


def repo_name(model: str) -> str:
    """The folder `hf download --local-dir` conventionally uses: the repo's name."""
    return model.rsplit("/", 1)[-1]


def hf_config(shape: Shape, eos_id: int | None = None) -> dict:
    """The architecture fields of shape's transformers config.json (what a model folder must agree with)."""
    config = {
        "architectures": [HF_ARCHITECTURE[shape.family]],
        "model_type": HF_MODEL_TYPE[shape.family],
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.dim,
        "num_hidden_layers": shape.n_layers,
        "num_attention_heads": shape.n_heads,
        "num_key_value_heads": shape.n_kv_heads,
        "head_dim": shape.head_dim,
        "tie_word_embeddings": shape.tied,
        "hidden_act": "silu",
        "attention_bias": False,
    }
    if shape.num_experts:
        config.update(
            num_experts=shape.num_experts,
            num_experts_per_tok=shape.top_k,
            moe_intermediate_size=shape.hidden_dim,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    else:
        config["intermediate_size"] = shape.hidden_dim
    if eos_id is not None:
        config["eos_token_id"] = eos_id
    return config


def of_model_config(model_config) -> Shape:
    """The Shape of torchtitan's Qwen3 model config (native, nki_moe) or a transformers config (v5's)."""
    if hasattr(model_config, "layers"):  # torchtitan's Decoder.Config
        layer = model_config.layers[0]
        attention, moe = layer.attention, layer.moe
        common = dict(
            dim=model_config.dim,
            n_layers=len(model_config.layers),
            n_heads=attention.n_heads,
            n_kv_heads=attention.n_kv_heads or attention.n_heads,
            head_dim=attention.head_dim or model_config.dim // attention.n_heads,
            vocab_size=model_config.vocab_size,
            tied=model_config.enable_weight_tying,
        )
        if moe is not None:
            return Shape(
                **common,
                hidden_dim=moe.routed_experts.inner_experts.hidden_dim,
                num_experts=moe.num_experts,
                top_k=moe.router.top_k,
            )
        return Shape(**common, hidden_dim=layer.feed_forward.w1.out_features)
    c = model_config  # a transformers PretrainedConfig
    heads = c.num_attention_heads
    common = dict(
        dim=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=heads,
        n_kv_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
        vocab_size=c.vocab_size,
        tied=bool(getattr(c, "tie_word_embeddings", False)),
    )
    if getattr(c, "num_experts", None):
        return Shape(
            **common, hidden_dim=c.moe_intermediate_size, num_experts=c.num_experts, top_k=c.num_experts_per_tok
        )
    return Shape(**common, hidden_dim=c.intermediate_size)


def of_run(config) -> Shape | None:
    """The Shape of the model a run trains: v5's is its config.json's, None before the assets are fetched."""
    model = config.model_spec.model
    if not hasattr(model, "layers"):  # v5: the transformers model's config.json, once the assets are here
        from transformers import AutoConfig

        try:
            model = AutoConfig.from_pretrained(config.hf_model)
        except OSError:
            return None
    return of_model_config(model)


# Adam in fp32 with fp32 master weights and gradients: what FSDP shards over the ranks, per parameter.
STATE_BYTES_PER_PARAM = 16
# Of each rank's device memory, what the sharded state may take; the rest is for activations, the unsharded layer
# FSDP gathers, and the runtime.
STATE_SHARE = 0.6
NEURON_GIB_PER_CORE = {1: 12, 2: 24}  # trn2's 96 GiB per device over its logical NeuronCores, by the LNC


def fit(parameters: int, ranks: int, memory_gib: float | None) -> tuple:
    """(fits, one line saying why) for FSDP over `ranks` ranks of `memory_gib` each (None: unknown, e.g. CPU)."""
    state = STATE_BYTES_PER_PARAM * parameters / ranks / 2**30
    line = (
        f"FSDP over {ranks} ranks: {state:.1f} GiB of weights, gradients and Adam state per rank "
        f"({parameters / 1e9:.2f} B parameters x {STATE_BYTES_PER_PARAM} B / {ranks})"
    )
    if memory_gib is None:
        return True, line
    budget = STATE_SHARE * memory_gib
    if state <= budget:
        return True, f"{line}, within {STATE_SHARE:.0%} of {memory_gib:g} GiB"
    needed = math.ceil(STATE_BYTES_PER_PARAM * parameters / (budget * 2**30))
    return False, (
        f"{line}: more than {STATE_SHARE:.0%} of the {memory_gib:g} GiB per rank; it needs at least "
        f"{needed} ranks (add nodes: NNODES)"
    )


if __name__ == "__main__":  # the launcher's `--list`
    for model, flavor in MODELS.items():
        shape = FLAVORS[flavor]
        print(
            f"  {model:<32} {shape.family:<5} {shape.parameters() / 1e9:6.2f} B parameters"
            + (f", {shape.parameters(active=True) / 1e9:.2f} B active" if shape.num_experts else "")
        )
