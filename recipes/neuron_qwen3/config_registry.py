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

import torch
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.experiments.transformers_modeling_backend.config_registry import transformers_modeling_backend_full
from torchtitan.experiments.transformers_modeling_backend.configs import TransformersBackendConfig
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
from torchtitan.models.common import CosSinRoPE, Embedding, Linear
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.qwen3 import model_registry

try:  # the qwen3 folder's own private builders, used at smoke size: torchtitan 0.3.0's names
    from torchtitan.models.qwen3 import (
        _EMBEDDING_INIT,
        _LINEAR_INIT,
        _build_qwen3_layers,
        _build_qwen3_moe_layers,
        _qwen3_norm,
    )
except ImportError as error:
    import torchtitan

    raise ImportError(f"neuron_qwen3's smoke models use torchtitan 0.3.0's private Qwen3 builders; torchtitan "
                      f"{torchtitan.__version__} has no {error.name or error}") from error
from torchtitan.models.qwen3.config_registry import qwen3_1_7b, qwen3_30b_a3b
from torchtitan.models.qwen3.model import Qwen3Model
from torchtitan.trainer import Trainer

from entrypoint.contract import VARS
from entrypoint.models import MODELS, repo_name
from entrypoint.variants import VARIANTS
from neuron_qwen3 import data, hf_rope_fix
from neuron_qwen3.titan_compat import LRSchedulersContainer

ASSETS = Path(__file__).resolve().parent / "assets"
SMOKE_TOKENIZER = ASSETS / "tokenizer"
SMOKE_CORPUS = ASSETS / "corpus"
SMOKE_HF_MODEL = ASSETS / "hf_qwen3_tiny"  # config.json of a Qwen3ForCausalLM at smoke size
NKI_EXPERTS_OVERRIDE = "neuron_qwen3.moe.experts.nki_grouped_experts"


ASSETS_DIR = next(var.default for var in VARS if var.name == "ASSETS_DIR")  # the article's ./assets/hf


def _hf_assets(repo: str) -> str:
    """The article's local download directory: ./assets/hf/<model> (`hf download --local-dir`); the launcher
    passes $ASSETS_DIR/<model> instead."""
    return os.path.abspath(os.path.join(ASSETS_DIR, repo))


def _observed(metrics: MetricsProcessor.Config) -> MetricsProcessor.Config:
    """TensorBoard always ($OUTPUT_DIR/tb); Weights & Biases only when asked for (a key, or offline mode)."""
    wandb = bool(os.environ.get("WANDB_API_KEY")) or os.environ.get("WANDB_MODE") == "offline"
    return dataclasses.replace(metrics, enable_tensorboard=True, save_tb_folder="tb", enable_wandb=wandb)


def _article_training(config: Trainer.Config) -> Trainer.Config:
    """What the article sets on every way: c4, 10 steps, local batch 1, FSDP over every rank; runs observed."""
    # The article trains on "c4_test", a fixture of torchtitan's git repository that the 0.3.0
    # wheel does not ship; the full configs use the "c4" loader (allenai/c4, streamed) instead.
    config.dataloader = data.from_env(HuggingFaceTextDataLoader.Config(dataset="c4"))
    config.training.steps = 10
    config.training.local_batch_size = 1
    config.parallelism.data_parallel_shard_degree = -1
    config.metrics = _observed(config.metrics)
    return config


# ---- the three ways, at full scale -------------------------------------------------------------


def _shape(model: str, family: str):
    """The Qwen3 `model` names (entrypoint/models.py), checked to be of the variant's family."""
    assert model in MODELS, f"MODEL={model!r} is not a Qwen3 this image knows (see `python -m entrypoint --list`)"
    shape = MODELS[model]
    assert shape.family == family, f"MODEL={model} is a {shape.family} Qwen3; this config trains {family} ones"
    return shape


def _v5(model: str) -> TransformersBackendConfig:
    hf_rope_fix.apply()  # the v5 variant trains with NaN loss without it; see hf_rope_fix.py
    config = transformers_modeling_backend_full()
    _shape(model, "dense")
    # Field names are the article's; they are unchanged in torchtitan 0.3.0.
    config.hf_model = model
    config.hf_assets_path = _hf_assets(repo_name(model))
    return _article_training(config)


def _with_model_spec(config: Trainer.Config, model_spec) -> Trainer.Config:
    """`model_spec` in place of the config's, and the loss sized to its vocabulary."""
    config.model_spec = model_spec
    config.loss = ChunkedLossWrapper.Config(
        loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec))
    )
    return config


def _native(model: str) -> Trainer.Config:
    # torchtitan's trainer settings for dense Qwen3; the flavor replaces its model
    config = _with_model_spec(qwen3_1_7b(), model_registry(_shape(model, "dense").flavor))
    config.hf_assets_path = _hf_assets(repo_name(model))
    return _article_training(config)


def _nki_moe(model: str) -> Trainer.Config:
    # torchtitan's trainer settings for MoE Qwen3; the flavor replaces its model
    config = _with_model_spec(qwen3_30b_a3b(), model_registry(_shape(model, "moe").flavor))
    config.hf_assets_path = _hf_assets(repo_name(model))
    config.override.imports = [NKI_EXPERTS_OVERRIDE]
    return _article_training(config)


def v5_qwen3_4b() -> TransformersBackendConfig:
    """1. Transformers v5 backend: the Hub definition supplies the architecture."""
    return _v5(VARIANTS["v5"].hf_repo)


def native_qwen3_4b() -> Trainer.Config:
    """2. torchtitan's native Qwen3 spec, flavor 4B (0.3.0 ships no qwen3_4b config: derived from 1.7B)."""
    return _native(VARIANTS["native"].hf_repo)


def nki_moe_qwen3_30b_a3b() -> Trainer.Config:
    """3. Native Qwen3-30B-A3B MoE with the experts swapped through torchtitan's override registry."""
    return _nki_moe(VARIANTS["nki_moe"].hf_repo)


# ---- any Qwen3: MODEL (set by the launcher, resolved) picks the size and form ---------------------


def _model_from_env() -> str:
    assert os.environ.get("MODEL"), "MODEL is unset: the launcher sets it for these configs (or export it by hand)"
    return os.environ["MODEL"]


def v5_qwen3() -> TransformersBackendConfig:
    return _v5(_model_from_env())


def native_qwen3() -> Trainer.Config:
    return _native(_model_from_env())


def nki_moe_qwen3() -> Trainer.Config:
    return _nki_moe(_model_from_env())


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
    config.dataloader = data.from_env(
        HuggingFaceTextDataLoader.Config(dataset="c4_test", dataset_path=str(SMOKE_CORPUS)))
    config.training.steps = 10
    config.training.local_batch_size = 2
    config.training.seq_len = 256
    config.lr_scheduler = LRSchedulersContainer.Config(warmup_steps=2, decay_ratio=0.8, decay_type="linear")
    config.metrics = dataclasses.replace(config.metrics, log_freq=1)
    config.debug.seed = 0
    return config


def _small_qwen3(s: dict, moe: dict | None) -> Qwen3Model.Config:
    """A Qwen3 of shape `s` built by torchtitan's own layer builders, dense or (with `moe`) MoE; `moe` may give
    the MoE model its own dim."""
    dim = moe.get("dim", s["dim"]) if moe else s["dim"]
    moe_sizes = {k: v for k, v in (moe or {}).items() if k != "dim"}
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


def _with_small_model(config: Trainer.Config, flavor: str, shape: dict, moe: dict | None) -> Trainer.Config:
    base = model_registry("debugmodel_moe" if moe else "debugmodel")
    return _smoke_training(_with_model_spec(config, dataclasses.replace(base, flavor=flavor, model=_small_qwen3(shape, moe))))


def v5_qwen3_smoke() -> TransformersBackendConfig:
    config = _smoke_training(v5_qwen3_4b())
    config.hf_model = str(SMOKE_HF_MODEL)  # AutoConfig reads config.json from this directory
    return config


def native_qwen3_smoke() -> Trainer.Config:
    return _with_small_model(native_qwen3_4b(), "smoke", SMOKE, None)


def nki_moe_qwen3_smoke() -> Trainer.Config:
    config = _with_small_model(nki_moe_qwen3_30b_a3b(), "smoke_moe", SMOKE, SMOKE_MOE)
    config.training.seq_len = SMOKE_MOE_SEQ_LEN
    return config


def native_moe_qwen3_smoke() -> Trainer.Config:
    """The nki_moe smoke model with torchtitan's own experts: the baseline nki_moe must match."""
    config = nki_moe_qwen3_smoke()
    config.override.imports = []
    return config


# ---- bench twins: big enough that matmuls, not start-up, set the throughput ------------------------------

# Sized for the device found. CPU: a 0.2B dense Qwen3 (Qwen3-0.6B's width, 16 layers, the bundled 2048-token
# vocabulary), its MoE twin 0.35B with 0.13B active (8 experts, top 2), sequence 2048. With an accelerator:
# Qwen3-1.7B's shape (its 151,936-token vocabulary too), the MoE twin 4.2B with the dense model's active width
# (32 experts of 768, top 8), sequence 4096, in torchtitan's default precision (FSDP, bf16 parameters in
# compute; fp32 on CPU). The bundled tokenizer and corpus either way: no network.
BENCH = dict(dim=1024, n_layers=16, n_heads=8, n_kv_heads=4, head_dim=128, hidden_dim=3072, vocab_size=2048)
BENCH_MOE = dict(num_experts=8, top_k=2, moe_hidden_dim=768)
BENCH_ACCELERATOR = dict(dim=2048, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, hidden_dim=6144,
                         vocab_size=151936)
BENCH_ACCELERATOR_MOE = dict(num_experts=32, top_k=8, moe_hidden_dim=768)
# config.json of each dense bench shape as a Qwen3ForCausalLM, for the v5 variant (assets/make_assets.py)
BENCH_HF_MODEL = {False: ASSETS / "hf_qwen3_bench", True: ASSETS / "hf_qwen3_bench_accelerator"}


def _accelerator() -> bool:
    return torch._utils._get_available_device_type() is not None  # as cpu_adapter.needed() asks


def _bench(config: Trainer.Config) -> Trainer.Config:
    config.training.local_batch_size = 1
    config.training.seq_len = 4096 if _accelerator() else 2048
    if not _accelerator():  # bf16 matmuls on a CPU without bf16 units run ~100x slower than fp32 (AVX2 here)
        config.training.mixed_precision_param = "float32"
    return config


def _bench_model(config: Trainer.Config, flavor: str, moe: bool) -> Trainer.Config:
    big = _accelerator()
    shape = BENCH_ACCELERATOR if big else BENCH
    experts = (BENCH_ACCELERATOR_MOE if big else BENCH_MOE) if moe else None
    return _bench(_with_small_model(config, flavor, shape, experts))


def v5_qwen3_bench() -> TransformersBackendConfig:
    config = _bench(v5_qwen3_smoke())
    config.hf_model = str(BENCH_HF_MODEL[_accelerator()])
    return config


def native_qwen3_bench() -> Trainer.Config:
    return _bench_model(native_qwen3_4b(), "bench", moe=False)


def nki_moe_qwen3_bench() -> Trainer.Config:
    config = _bench_model(nki_moe_qwen3_30b_a3b(), "bench_moe", moe=True)
    if not _accelerator():  # the experts' own bf16 cast too (a step took over 10 min): fp32 like the rest on CPU
        config.override.imports = [(NKI_EXPERTS_OVERRIDE, {"compute_dtype": "float32"})]
    return config
