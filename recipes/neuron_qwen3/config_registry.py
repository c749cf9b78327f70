"""Config functions for `--module neuron_qwen3 --config NAME`: the article's three ways, plus smoke twins.

Each function builds a torchtitan 0.3.0 trainer config and mutates a few fields, as torchtitan's
own config registries do. The full-scale configs are the article's; each `*_smoke` twin keeps
the same model code path, trainer and data pipeline and shrinks the model to train on two CPU
cores in seconds, on the tokenizer and corpus bundled in assets/ (no network).

Which config a VARIANT/SCALE runs is decided in one place, entrypoint/variants.py.
"""

import dataclasses
import os
from pathlib import Path

from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.experiments.transformers_modeling_backend.config_registry import transformers_modeling_backend_full
from torchtitan.experiments.transformers_modeling_backend.configs import TransformersBackendConfig
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
from torchtitan.models.common import CosSinRoPE, Embedding, Linear
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.qwen3 import (  # the qwen3 folder's own builders, used at smoke size
    _EMBEDDING_INIT,
    _LINEAR_INIT,
    _build_qwen3_layers,
    _build_qwen3_moe_layers,
    _qwen3_norm,
    model_registry,
)
from torchtitan.models.qwen3.config_registry import qwen3_1_7b, qwen3_30b_a3b
from torchtitan.models.qwen3.model import Qwen3Model
from torchtitan.trainer import Trainer

from neuron_qwen3 import hf_rope_fix
from neuron_qwen3.titan_compat import LRSchedulersContainer

hf_rope_fix.apply()  # the v5 variant trains with NaN loss without it; see hf_rope_fix.py

ASSETS = Path(__file__).resolve().parent / "assets"
SMOKE_TOKENIZER = ASSETS / "tokenizer"
SMOKE_CORPUS = ASSETS / "corpus"
SMOKE_HF_MODEL = ASSETS / "hf_qwen3_tiny"  # config.json of a Qwen3ForCausalLM at smoke size
NKI_EXPERTS_OVERRIDE = "neuron_qwen3.moe.experts.nki_grouped_experts"


def _hf_assets(repo_name: str) -> str:
    """The article's local download directory: ./assets/hf/<model> (`hf download --local-dir`)."""
    return os.path.abspath(f"./assets/hf/{repo_name}")


def _article_training(config: Trainer.Config) -> Trainer.Config:
    """What the article sets on every way: c4, 10 steps, local batch 1, FSDP over every rank."""
    # The article trains on "c4_test", a fixture of torchtitan's git repository that the 0.3.0
    # wheel does not ship; the full configs use the "c4" loader (allenai/c4, streamed) instead.
    config.dataloader = HuggingFaceTextDataLoader.Config(dataset="c4")
    config.training.steps = 10
    config.training.local_batch_size = 1
    config.parallelism.data_parallel_shard_degree = -1
    return config


# ---- the three ways, at full scale -------------------------------------------------------------


def v5_qwen3_4b() -> TransformersBackendConfig:
    """1. Transformers v5 backend: the Hub definition supplies the architecture."""
    config = transformers_modeling_backend_full()
    # Field names are the article's; they are unchanged in torchtitan 0.3.0.
    config.hf_model = "Qwen/Qwen3-4B-Instruct-2507"
    config.hf_assets_path = _hf_assets("Qwen3-4B-Instruct-2507")
    return _article_training(config)


def native_qwen3_4b() -> Trainer.Config:
    """2. torchtitan's native Qwen3 spec, flavor 4B (0.3.0 ships no qwen3_4b config: derived from 1.7B)."""
    config = qwen3_1_7b()
    config.model_spec = model_registry("4B")
    config.loss = ChunkedLossWrapper.Config(
        loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec))
    )
    config.hf_assets_path = _hf_assets("Qwen3-4B")
    return _article_training(config)


def nki_moe_qwen3_30b_a3b() -> Trainer.Config:
    """3. Native Qwen3-30B-A3B MoE with the experts swapped through torchtitan's override registry."""
    config = qwen3_30b_a3b()
    config.override.imports = [NKI_EXPERTS_OVERRIDE]
    return _article_training(config)


# ---- smoke twins -------------------------------------------------------------------------------

SMOKE = dict(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, hidden_dim=384, vocab_size=2048)
# The MoE smoke model's dim and expert hidden dim are the smallest the NKI kernels take (H 512, I a multiple
# of 32 per logical core at LNC 2; moe/nki_kernels.py), so CPU runs the very block layout Trainium will. Blocks
# hold 256 rows: 4 experts and 128-token sequences keep the padded blocks (and CI's CPU time) small.
SMOKE_MOE = dict(dim=512, num_experts=4, top_k=2, moe_hidden_dim=64)
SMOKE_MOE_SEQ_LEN = 128


def _smoke_training(config: Trainer.Config) -> Trainer.Config:
    """Bundled tokenizer and corpus, short sequences, ten steps, a fixed seed."""
    config.hf_assets_path = str(SMOKE_TOKENIZER)
    config.dataloader = HuggingFaceTextDataLoader.Config(dataset="c4_test", dataset_path=str(SMOKE_CORPUS))
    config.training.steps = 10
    config.training.local_batch_size = 2
    config.training.seq_len = 256
    config.lr_scheduler = LRSchedulersContainer.Config(warmup_steps=2, decay_ratio=0.8, decay_type="linear")
    config.metrics = MetricsProcessor.Config(log_freq=1)
    config.debug.seed = 0
    return config


def _smoke_qwen3(moe: bool) -> Qwen3Model.Config:
    """A two-layer Qwen3 built by torchtitan's own layer builders, dense or MoE."""
    s = SMOKE
    moe_sizes = {k: v for k, v in SMOKE_MOE.items() if k != "dim"}
    dim = SMOKE_MOE["dim"] if moe else s["dim"]
    common = dict(
        n_layers=s["n_layers"], dim=dim, n_heads=s["n_heads"], n_kv_heads=s["n_kv_heads"],
        head_dim=s["head_dim"], attn_backend="flex",
        rope=CosSinRoPE.Config(dim=s["head_dim"], max_seq_len=4096, theta=1000000.0),
    )
    if moe:
        layers = _build_qwen3_moe_layers(**common, **moe_sizes, moe_comm_backend="standard")
    else:
        layers = _build_qwen3_layers(**common, hidden_dim=s["hidden_dim"])
    return Qwen3Model.Config(
        vocab_size=s["vocab_size"],
        dim=dim,
        norm=_qwen3_norm(dim),
        enable_weight_tying=not moe,
        tok_embeddings=Embedding.Config(num_embeddings=s["vocab_size"], embedding_dim=dim, param_init=_EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=s["vocab_size"], param_init=_LINEAR_INIT),
        layers=layers,
    )


def _with_smoke_model(config: Trainer.Config, flavor: str, moe: bool) -> Trainer.Config:
    base = model_registry("debugmodel_moe" if moe else "debugmodel")
    config.model_spec = dataclasses.replace(base, flavor=flavor, model=_smoke_qwen3(moe))
    config.loss = ChunkedLossWrapper.Config(
        loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec))
    )
    return _smoke_training(config)


def v5_qwen3_smoke() -> TransformersBackendConfig:
    config = _smoke_training(v5_qwen3_4b())
    config.hf_model = str(SMOKE_HF_MODEL)  # AutoConfig reads config.json from this directory
    return config


def native_qwen3_smoke() -> Trainer.Config:
    return _with_smoke_model(native_qwen3_4b(), "smoke", moe=False)


def nki_moe_qwen3_smoke() -> Trainer.Config:
    config = _with_smoke_model(nki_moe_qwen3_30b_a3b(), "smoke_moe", moe=True)
    config.training.seq_len = SMOKE_MOE_SEQ_LEN
    return config


def native_moe_qwen3_smoke() -> Trainer.Config:
    """The nki_moe smoke model with torchtitan's own experts: the baseline nki_moe must match."""
    config = nki_moe_qwen3_smoke()
    config.override.imports = []
    return config
