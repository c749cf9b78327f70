"""MODEL: the Qwen3 checkpoints this image trains, by Hub id -> family, torchtitan flavor and shape.

The shapes are those of torchtitan 0.3.0's `qwen3_configs` (and of each repo's config.json); a test builds every
flavor on the meta device and checks `parameters()` here against it. The launcher uses them for the plan (how
the model fits on the ranks), the recipes to pick the flavor, and the pre-launch checks to compare a local
folder's config.json with what will be trained. Stdlib only: the launcher imports it.
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    flavor: str  # torchtitan.models.qwen3.model_registry(flavor)
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int  # the dense MLP's, or each expert's for MoE
    vocab_size: int = 151936
    tied: bool = False  # lm_head shares the embedding's weight
    num_experts: int = 0  # 0: dense
    top_k: int = 0

    @property
    def family(self) -> str:
        return "moe" if self.num_experts else "dense"

    def parameters(self, active: bool = False) -> int:
        """Parameters of the model; `active`: those one token uses (top_k of the experts)."""
        q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        attention = self.dim * q + 2 * self.dim * kv + q * self.dim + 2 * self.head_dim  # + q/k norms
        if self.num_experts:
            experts = self.top_k if active else self.num_experts
            mlp = experts * 3 * self.dim * self.hidden_dim + self.dim * self.num_experts  # + router
        else:
            mlp = 3 * self.dim * self.hidden_dim
        layer = attention + mlp + 2 * self.dim  # + the two RMSNorms
        embeddings = self.vocab_size * self.dim * (1 if self.tied else 2)
        return self.n_layers * layer + embeddings + self.dim  # + the final norm


SHAPES = {s.flavor: s for s in (
    Shape("0.6B", 1024, 28, 16, 8, 128, 3072, tied=True),
    Shape("1.7B", 2048, 28, 16, 8, 128, 6144, tied=True),
    Shape("4B", 2560, 36, 32, 8, 128, 9728, tied=True),
    Shape("8B", 4096, 36, 32, 8, 128, 12288),
    Shape("14B", 5120, 40, 40, 8, 128, 17408),
    Shape("32B", 5120, 64, 64, 8, 128, 25600),
    Shape("30B-A3B", 2048, 48, 32, 4, 128, 768, num_experts=128, top_k=8),
    Shape("235B-A22B", 4096, 94, 64, 4, 128, 1536, num_experts=128, top_k=8),
)}
# The repos Qwen publishes for each flavor (the released forms; FP8/GGUF/AWQ copies are not trainable here).
FORMS = {
    "0.6B": ("", "-Base"), "1.7B": ("", "-Base"), "4B": ("", "-Base", "-Instruct-2507", "-Thinking-2507"),
    "8B": ("", "-Base"), "14B": ("", "-Base"), "32B": ("",),
    "30B-A3B": ("", "-Base", "-Instruct-2507", "-Thinking-2507"), "235B-A22B": ("", "-Instruct-2507", "-Thinking-2507"),
}
MODELS = {f"Qwen/Qwen3-{flavor}{form}": SHAPES[flavor] for flavor, forms in FORMS.items() for form in forms}
# config.json's `model_type` of each family, as transformers writes it.
HF_MODEL_TYPE = {"dense": "qwen3", "moe": "qwen3_moe"}

# Adam in fp32 with fp32 master weights and gradients: what FSDP shards over the ranks, per parameter.
STATE_BYTES_PER_PARAM = 16
# Of each rank's device memory, what the sharded state may take; the rest is for activations, the unsharded
# layer FSDP gathers, and the runtime.
STATE_SHARE = 0.6


def repo_name(model: str) -> str:
    """The folder `hf download --local-dir` conventionally uses: the repo's name."""
    return model.rsplit("/", 1)[-1]


def fit(shape: Shape, ranks: int, memory_gib: float | None) -> tuple:
    """(fits, one line saying why) for FSDP over `ranks` ranks of `memory_gib` each (None: unknown, e.g. CPU)."""
    state = STATE_BYTES_PER_PARAM * shape.parameters() / ranks / 2**30
    line = (f"FSDP over {ranks} ranks: {state:.1f} GiB of weights, gradients and Adam state per rank "
            f"({shape.parameters() / 1e9:.2f} B parameters x {STATE_BYTES_PER_PARAM} B / {ranks})")
    if memory_gib is None:
        return True, line
    budget = STATE_SHARE * memory_gib
    if state <= budget:
        return True, f"{line}, within {STATE_SHARE:.0%} of {memory_gib:g} GiB"
    needed = math.ceil(STATE_BYTES_PER_PARAM * shape.parameters() / (budget * 2**30))
    return False, (f"{line}: more than {STATE_SHARE:.0%} of the {memory_gib:g} GiB per rank; it needs at least "
                   f"{needed} ranks (add nodes: NNODES)")
