"""Config functions for `--module neuron_qwen3 --config NAME`: the article's three ways, every Qwen3, smoke and bench.

Each function builds a torchtitan 0.3.0 trainer config and mutates a few fields, as torchtitan's own config
registries do; each is a value: no I/O, no environment, no device probe. Every value a run adds comes as a flag
(`--training.steps`, `--dataloader.source`, `--export.dir`, ...). The full-scale functions are the article's; one
per released Qwen3 flavor serves MODEL (`native_qwen3_8b`, `nki_moe_qwen3_235b_a22b`, ...); each `*_smoke` twin
keeps the same model code path, trainer and data pipeline and shrinks the model to train on two CPU cores in
seconds, on the tokenizer and corpus bundled in assets/ (no network); the `*_bench` twins are sized for
throughput on an accelerator, `*_bench_cpu` for a CPU host.

Which config a VARIANT/SCALE runs is decided in one place, the launcher's variant table.
"""

import dataclasses
import functools
import os
from pathlib import Path

from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
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

    raise ImportError(
        f"neuron_qwen3's smoke models use torchtitan 0.3.0's private Qwen3 builders; torchtitan "
        f"{torchtitan.__version__} has no {error.name or error}"
    ) from error
from torchtitan.models.qwen3 import config_registry as qwen3_configs
from torchtitan.models.qwen3.model import Qwen3Model

from neuron_qwen3 import data, shapes
from neuron_qwen3.finish import NKI_EXPERTS as NKI_EXPERTS_OVERRIDE
from neuron_qwen3.quirks import titan_logs
from neuron_qwen3.quirks.titan_compat import LRSchedulersContainer
from neuron_qwen3.trainer import Qwen3Trainer

titan_logs.install()  # before any config function builds torchtitan's checkpoint Config (quirks/titan_logs.py)

ASSETS = Path(__file__).resolve().parent / "assets"
SMOKE_TOKENIZER = ASSETS / "tokenizer"
SMOKE_CORPUS = ASSETS / "corpus"
SMOKE_PROMPTS = ASSETS / "samples.jsonl"  # SAMPLE_PROMPTS' default at smoke scale
# config.json of each dense smoke/bench shape as a Qwen3ForCausalLM, for the v5 variant (assets/make_assets.py)
HF_MODEL = {
    "smoke": ASSETS / "hf_qwen3_tiny",
    "bench_cpu": ASSETS / "hf_qwen3_bench_cpu",
    "bench": ASSETS / "hf_qwen3_bench",
}
ARTICLE_ASSETS = "./assets/hf"  # the article's `hf download --local-dir` folder; the launcher passes ASSETS_DIR's


def _as(config, cls):
    """torchtitan's config function's result as the project's Config subclass `cls` (its fields copied)."""
    return cls(**{field.name: getattr(config, field.name) for field in dataclasses.fields(config) if field.init})


def described(variant: str, scale: str):
    """Mark a config function with what it trains, for the run report (summary.json names them)."""

    def mark(build):
        @functools.wraps(build)
        def config():
            built = build()
            built.report = dataclasses.replace(built.report, variant=variant, scale=scale, config=build.__name__)
            return built

        return config

    return mark


def _observed(config):
    """TensorBoard always ($OUTPUT_DIR/tb); Weights & Biases with `--metrics.enable_wandb`."""
    config.metrics = dataclasses.replace(config.metrics, enable_tensorboard=True, save_tb_folder="tb")
    return config


def _article_training(config, model: str):
    """What the article sets on every way: c4, 10 steps, local batch 1, FSDP over every rank; runs observed."""
    # The article trains on "c4_test", a fixture of torchtitan's git repository that the 0.3.0
    # wheel does not ship; the full configs stream c4 (allenai/c4) instead.
    config.hf_assets_path = os.path.join(ARTICLE_ASSETS, shapes.repo_name(model))
    config.dataloader = data.DataLoader.Config(source="c4")
    config.training.steps = 10
    config.training.local_batch_size = 1
    config.parallelism.data_parallel_shard_degree = -1
    config.report = dataclasses.replace(config.report, model=model)
    return _observed(config)


# ---- the three ways, at full scale -------------------------------------------------------------


def _family(model: str, family: str) -> str:
    """The torchtitan flavor of the Qwen3 `model` names, checked to be of the variant's family."""
    flavor = shapes.MODELS[model]
    assert shapes.FLAVORS[flavor].family == family, f"{model} is a {shapes.FLAVORS[flavor].family} Qwen3"
    return flavor


def _v5(model: str):
    from torchtitan.experiments.transformers_modeling_backend import model_registry as transformers_model_registry
    from torchtitan.experiments.transformers_modeling_backend.config_registry import (
        transformers_modeling_backend_full,
    )

    from neuron_qwen3.v5 import Qwen3TransformersTrainer

    _family(model, "dense")
    config = _as(transformers_modeling_backend_full(), Qwen3TransformersTrainer.Config)
    # The "full" flavor's mask is plain causal: a packed document attends to the ones before it while its
    # positions restart. "sft_full" is the same model with attn_mask_type="block_causal", a mask per document
    # as the native models have, so v5 and native train the same function.
    config.model_spec = transformers_model_registry("sft_full")
    config.hf_model = model  # the article's field: the Hub definition supplies the architecture
    return _article_training(config, model)


def _with_model_spec(config, model_spec):
    """`model_spec` in place of the config's, and the loss sized to its vocabulary."""
    config.model_spec = model_spec
    config.loss = ChunkedLossWrapper.Config(
        loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec))
    )
    return config


def _native(model: str) -> Qwen3Trainer.Config:
    # torchtitan's trainer settings for dense Qwen3; the flavor replaces its model
    config = _as(qwen3_configs.qwen3_1_7b(), Qwen3Trainer.Config)
    return _article_training(_with_model_spec(config, model_registry(_family(model, "dense"))), model)


def _nki_moe(model: str) -> Qwen3Trainer.Config:
    # torchtitan's trainer settings for MoE Qwen3; the flavor replaces its model
    config = _as(qwen3_configs.qwen3_30b_a3b(), Qwen3Trainer.Config)
    config = _with_model_spec(config, model_registry(_family(model, "moe")))
    config.override.imports = [NKI_EXPERTS_OVERRIDE]
    return _article_training(config, model)


@described("v5", "full")
def v5_qwen3_4b():
    """1. Transformers v5 backend: the Hub definition supplies the architecture."""
    return _v5("Qwen/Qwen3-4B-Instruct-2507")


@described("native", "full")
def native_qwen3_4b() -> Qwen3Trainer.Config:
    """2. torchtitan's native Qwen3 spec, flavor 4B (0.3.0 ships no qwen3_4b config: derived from 1.7B)."""
    return _native("Qwen/Qwen3-4B")


@described("nki_moe", "full")
def nki_moe_qwen3_30b_a3b() -> Qwen3Trainer.Config:
    """3. Native Qwen3-30B-A3B MoE with the experts swapped through torchtitan's override registry."""
    return _nki_moe("Qwen/Qwen3-30B-A3B")


def _flavor_configs() -> dict:
    """`<variant>_qwen3_<flavor>` for every other released flavor (MODEL=Qwen/Qwen3-8B runs native_qwen3_8b)."""
    configs = {}
    for flavor, shape in shapes.FLAVORS.items():
        ways = (("native", _native), ("v5", _v5)) if shape.family == "dense" else (("nki_moe", _nki_moe),)
        for variant, way in ways:
            name, model = f"{variant}_qwen3_{shapes.flavor_name(flavor)}", f"Qwen/Qwen3-{flavor}"

            def build(way=way, model=model):
                return way(model)

            build.__name__ = build.__qualname__ = name
            build.__doc__ = f"{model} ({variant}); with the launcher, MODEL= any released form of it"
            configs[name] = described(variant, "full")(build)
    return configs


globals().update({name: build for name, build in _flavor_configs().items() if name not in globals()})


# ---- smoke and bench twins ------------------------------------------------------------------------


def _smoke_training(config):
    """Bundled tokenizer, corpus and sample prompts, short sequences, ten steps, a fixed seed; GRPO's groups and
    completions sized to the smoke batch and window."""
    config.hf_assets_path = str(SMOKE_TOKENIZER)
    config.dataloader = data.DataLoader.Config(source=str(SMOKE_CORPUS))
    config.samples = dataclasses.replace(config.samples, prompts=str(SMOKE_PROMPTS))
    config.grpo = dataclasses.replace(config.grpo, generations=2, max_completion=32)
    config.training.steps = 10
    config.training.local_batch_size = 2
    config.training.seq_len = 256
    config.lr_scheduler = LRSchedulersContainer.Config(warmup_steps=2, decay_ratio=0.8, decay_type="linear")
    config.metrics = dataclasses.replace(config.metrics, log_freq=1)
    config.debug.seed = 0
    config.report = dataclasses.replace(config.report, model="")
    return config


def _small_qwen3(shape: shapes.Shape) -> Qwen3Model.Config:
    """A Qwen3 of `shape` built by torchtitan's own layer builders, dense or MoE."""
    common = dict(
        n_layers=shape.n_layers,
        dim=shape.dim,
        n_heads=shape.n_heads,
        n_kv_heads=shape.n_kv_heads,
        head_dim=shape.head_dim,
        attn_backend="flex",
        rope=CosSinRoPE.Config(dim=shape.head_dim, max_seq_len=shapes.MAX_POSITIONS, theta=shapes.ROPE_THETA),
    )
    if shape.num_experts:
        layers = _build_qwen3_moe_layers(
            **common,
            num_experts=shape.num_experts,
            top_k=shape.top_k,
            moe_hidden_dim=shape.hidden_dim,
            moe_comm_backend="standard",
        )
    else:
        layers = _build_qwen3_layers(**common, hidden_dim=shape.hidden_dim)
    return Qwen3Model.Config(
        vocab_size=shape.vocab_size,
        dim=shape.dim,
        norm=_qwen3_norm(shape.dim),
        enable_weight_tying=shape.tied,
        tok_embeddings=Embedding.Config(
            num_embeddings=shape.vocab_size, embedding_dim=shape.dim, param_init=_EMBEDDING_INIT
        ),
        lm_head=Linear.Config(in_features=shape.dim, out_features=shape.vocab_size, param_init=_LINEAR_INIT),
        layers=layers,
    )


def _with_small_model(config, flavor: str, shape: shapes.Shape):
    base = model_registry("debugmodel_moe" if shape.num_experts else "debugmodel")
    spec = dataclasses.replace(base, flavor=flavor, model=_small_qwen3(shape))
    return _smoke_training(_with_model_spec(config, spec))


SMOKE_MOE_SEQ_LEN = 128  # 4 experts and 128-token sequences keep the padded 256-row blocks (and CI's CPU time) small


@described("v5", "smoke")
def v5_qwen3_smoke():
    config = _smoke_training(v5_qwen3_4b())
    config.hf_model = str(HF_MODEL["smoke"])  # AutoConfig reads config.json from this directory
    return config


@described("native", "smoke")
def native_qwen3_smoke() -> Qwen3Trainer.Config:
    return _with_small_model(native_qwen3_4b(), "smoke", shapes.SMOKE)


@described("nki_moe", "smoke")
def nki_moe_qwen3_smoke() -> Qwen3Trainer.Config:
    config = _with_small_model(nki_moe_qwen3_30b_a3b(), "smoke_moe", shapes.SMOKE_MOE)
    config.training.seq_len = SMOKE_MOE_SEQ_LEN
    return config


@described("native_moe", "smoke")
def native_moe_qwen3_smoke() -> Qwen3Trainer.Config:
    """The nki_moe smoke model with torchtitan's own experts: the baseline nki_moe must match."""
    config = nki_moe_qwen3_smoke()
    config.override.imports = []
    return config


def _bench(config, seq_len: int):
    config.training.local_batch_size = 1
    config.training.seq_len = seq_len
    return config


def _bench_cpu(config):
    """bf16 matmuls on a CPU without bf16 units run ~100x slower than fp32 (AVX2 here): fp32 throughout."""
    config.training.mixed_precision_param = "float32"
    if config.override.imports:  # the experts' own bf16 cast too (a step took over 10 min)
        config.override.imports = [(NKI_EXPERTS_OVERRIDE, {"compute_dtype": "float32"})]
    return _bench(config, 2048)


@described("v5", "bench")
def v5_qwen3_bench():
    config = _bench(v5_qwen3_smoke(), 4096)
    config.hf_model = str(HF_MODEL["bench"])
    return config


@described("native", "bench")
def native_qwen3_bench() -> Qwen3Trainer.Config:
    return _bench(_with_small_model(native_qwen3_4b(), "bench", shapes.BENCH), 4096)


@described("nki_moe", "bench")
def nki_moe_qwen3_bench() -> Qwen3Trainer.Config:
    return _bench(_with_small_model(nki_moe_qwen3_30b_a3b(), "bench_moe", shapes.BENCH_MOE), 4096)


@described("v5", "bench")
def v5_qwen3_bench_cpu():
    config = _bench_cpu(v5_qwen3_smoke())
    config.hf_model = str(HF_MODEL["bench_cpu"])
    return config


@described("native", "bench")
def native_qwen3_bench_cpu() -> Qwen3Trainer.Config:
    return _bench_cpu(_with_small_model(native_qwen3_4b(), "bench", shapes.BENCH_CPU))


@described("nki_moe", "bench")
def nki_moe_qwen3_bench_cpu() -> Qwen3Trainer.Config:
    return _bench_cpu(_with_small_model(nki_moe_qwen3_30b_a3b(), "bench_moe", shapes.BENCH_CPU_MOE))
