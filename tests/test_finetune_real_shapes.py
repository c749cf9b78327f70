"""Fine-tuning at Qwen3's real shapes on CPU: INIT_FROM a random model transformers made, 2 steps, EXPORT_DIR, served.

Two launcher runs, each at learning rate 0 (so the export must be the source, tensor for tensor) with a 64-token
sequence, the source saved in bfloat16 (as the Hub's) and exported in bfloat16 (EXPORT_DTYPE's default):
  dense: MODEL=Qwen/Qwen3-0.6B SCALE=full, its real config (28 layers, 1024 wide, 151,936 tokens, tied), 1 rank;
         ASSETS_DIR holds the source folder, so the run is offline; EXPORT_MAX_SHARD_MB=500: 3 files and an index.
  moe:   MODULE=real_width_recipes CONFIG=nki_moe_real_width (tests/real_width_recipes.py): Qwen3-30B-A3B's width
         (2048, experts of 768, 32 heads, 4 KV heads, untied) with 2 layers of 8 experts, top 2, 0.74 B
         parameters; 1 rank (on 2, the whole test peaked at 23.6 GiB and the kernel killed a rank); one file.
Both compute in float32 on CPU (finish.cpu_float32), which the launcher's pre-launch pass says.
The source folders carry the bundled tokenizer (2,048 ids, all below the vocabulary) and its chat template.
Cost (2 shared cores): 2.9 min; peak 17.7 GiB for the process tree, the MoE worker's step 2 (fp32 weights,
gradients and Adam state, 16 B a parameter, plus FSDP's unsharded copies); the dense worker peaks at 15.0 GiB.
Run: .venv/bin/python -m pytest tests/test_finetune_real_shapes.py
"""

import functools
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import ANSI, REPO, STEP_LOSS, folder_tensors, worker_env

pytestmark = pytest.mark.training
TESTS = os.path.dirname(os.path.abspath(__file__))
ZERO_LR = "--tune.lr 0"  # the weights stay: a round trip
SHORT = "--training.seq_len 64 --metrics.log_freq 1"
# Qwen/Qwen3-0.6B's config.json on the Hub; Qwen/Qwen3-30B-A3B's with 2 layers of 8 experts, top 2
DENSE = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


MAKE = """
import json, sys, torch, transformers
torch.manual_seed(0)
config = transformers.AutoConfig.for_model(**json.loads(sys.argv[1]))
transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(sys.argv[2])
"""


def save_source(folder, config: dict):
    """A random model of `config`, built and saved by transformers in bfloat16 (in a child: the test process stays
    small while the runs train), with the bundled tokenizer."""
    from neuron_qwen3.config_registry import SMOKE_TOKENIZER

    subprocess.run([sys.executable, "-c", MAKE, json.dumps(config), str(folder)], check=True, timeout=600)
    for name in os.listdir(SMOKE_TOKENIZER):
        shutil.copyfile(os.path.join(SMOKE_TOKENIZER, name), os.path.join(folder, name))
    return str(folder)


def corpus(path):
    from neuron_qwen3.config_registry import SMOKE_CORPUS

    shutil.copyfile(SMOKE_CORPUS / "train.jsonl", path)
    return str(path)


def launch(tmp, name, **env):
    env = worker_env(
        OUTPUT_DIR=f"{tmp}/{name}-out",
        CACHE_DIR=f"{tmp}/cache",
        EXPORT_DIR=f"{tmp}/{name}",
        DATASET=corpus(f"{tmp}/{name}.jsonl"),
        STEPS="2",
        SCALE="full",
        **env,
    )
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", *SHORT.split(), *ZERO_LR.split()],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )


@functools.cache
def runs(tmp):
    dense = save_source(f"{tmp}/assets/Qwen3-0.6B", DENSE)
    moe = save_source(f"{tmp}/moe-source", MOE)
    tests_on_path = os.pathsep.join(filter(None, (os.environ.get("PYTHONPATH"), TESTS)))
    return {
        "dense": (
            dense,
            f"{tmp}/dense",
            launch(
                tmp,
                "dense",
                VARIANT="native",
                MODEL="Qwen/Qwen3-0.6B",
                INIT_FROM=dense,
                ASSETS_DIR=f"{tmp}/assets",
                EXPORT_MAX_SHARD_MB="500",
            ),
        ),
        "moe": (
            moe,
            f"{tmp}/moe",
            launch(
                tmp,
                "moe",
                VARIANT="nki_moe",
                MODULE="real_width_recipes",
                CONFIG="nki_moe_real_width",
                INIT_FROM=moe,
                PYTHONPATH=tests_on_path,
            ),
        ),
    }


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """The two runs. Their sources and exports (5 GB) are removed when the module ends, not carried to the end of a
    whole test run, so `make test` needs that much less disk."""
    tmp = tmp_path_factory.mktemp("real-shapes")
    yield runs(str(tmp))
    shutil.rmtree(tmp)


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_two_steps_through_the_launcher(done, name):
    _, _, result = done[name]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = ANSI.sub("", result.stdout + result.stderr)
    assert sorted({int(step) for step, _ in STEP_LOSS.findall(text)}) == [1, 2]
    assert "entrypoint: precision: float32 (" in result.stdout  # the pre-launch pass, as the workers will
    assert "precision: float32 (" in text.split("entrypoint: precision")[-1]  # the worker's own line too


def test_summary_names_the_variant_and_scale_of_a_model_run(done):
    """A MODEL= run's summary.json names its variant, scale and config (not null)."""
    _, export, _ = done["dense"]
    summary = json.loads(open(f"{export}-out/report/summary.json").read())
    assert (summary["variant"], summary["scale"], summary["config"], summary["model"]) == (
        "native",
        "full",
        "native_qwen3_0_6b",
        "Qwen/Qwen3-0.6B",
    )


def test_the_export_is_in_the_hubs_sharded_layout(done):
    _, export, _ = done["dense"]
    files = sorted(name for name in os.listdir(export) if name.endswith(".safetensors"))
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert all(os.path.getsize(f"{export}/{name}") <= 500 * 10**6 for name in files)
    index = json.loads(open(f"{export}/model.safetensors.index.json").read())
    assert sorted(set(index["weight_map"].values())) == files
    assert os.listdir(f"{done['moe'][1]}").count("model.safetensors") == 1


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_config_is_the_sources_field_for_field(done, name):
    source, export, _ = done[name]
    exported, original = (json.loads(open(f"{folder}/config.json").read()) for folder in (export, source))
    assert exported == original  # both bfloat16: not even the dtype differs


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_every_tensor_comes_back_unchanged(done, name):
    source, export, _ = done[name]
    before, after = folder_tensors(source), folder_tensors(export)
    assert sorted(before) == sorted(after)
    for key, value in before.items():
        assert torch.equal(value, after[key]), key


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_served_by_transformers_with_the_tokenizer_and_chat_template(done, name):
    import transformers

    source, folder, _ = done[name]
    for file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert open(f"{folder}/{file}", "rb").read() == open(f"{source}/{file}", "rb").read(), file
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "The quiet cat"}], tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert [type(model).__name__] == (DENSE if name == "dense" else MOE)["architectures"]
    prompt = tokenizer(text, return_tensors="pt")
    generated = model.generate(**prompt, max_new_tokens=2, do_sample=False)
    assert generated.shape[1] == prompt["input_ids"].shape[1] + 2
