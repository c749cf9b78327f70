"""Fine-tuning proofs against transformers: INIT_FROM a model transformers made, train, EXPORT_DIR, serve it.

Two real launcher runs of the native smoke config on CPU, shared by every test here:
  A: INIT_FROM = a random Qwen3ForCausalLM saved by transformers, 8 steps at the config's pretraining learning rate
     (LR=8e-4: the model is random, not released), own data (.jsonl), EXPORT_DTYPE=float32 -> export A
  B: INIT_FROM = export A, learning rate 0, 2 steps, own data (.parquet), EXPORT_DTYPE=float32 -> export B
Run: .venv/bin/python -m pytest tests/test_finetune.py
"""

import functools
import json
import subprocess
import sys

import pytest
import torch

from conftest import ANSI, REPO, STEP_LOSS, worker_env

pytestmark = pytest.mark.training
ZERO_LR = "--tune.lr 0"  # the weights stay: a round trip


def losses(result) -> dict:
    return {int(s): float(v) for s, v in STEP_LOSS.findall(ANSI.sub("", result.stdout + result.stderr))}


def tiny_qwen3(folder):
    """A random Qwen3ForCausalLM of the smoke shape (the bundled config.json), saved by transformers."""
    import transformers

    from neuron_qwen3.config_registry import HF_MODEL

    config = json.loads((HF_MODEL["smoke"] / "config.json").read_text())
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**config)).save_pretrained(folder)
    return folder


def corpus_rows(count=400):
    from neuron_qwen3.config_registry import SMOKE_CORPUS

    lines = (SMOKE_CORPUS / "train.jsonl").read_text().splitlines()[:count]
    return [{"body": json.loads(line)["text"]} for line in lines]


@functools.cache
def runs(tmp):
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = tiny_qwen3(f"{tmp}/source")
    rows = corpus_rows()
    with open(f"{tmp}/own.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    pq.write_table(pa.Table.from_pylist(rows), f"{tmp}/own.parquet")

    def launch(name, **env):
        env = worker_env(
            VARIANT="native",
            SCALE="smoke",
            OUTPUT_DIR=f"{tmp}/{name}-out",
            CACHE_DIR=f"{tmp}/cache",
            EXPORT_DIR=f"{tmp}/{name}",
            EXPORT_DTYPE="float32",
            DATASET_FIELD="body",
            **env,
        )
        return subprocess.run(
            [sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
        )

    a = launch("a", INIT_FROM=source, STEPS="8", DATASET=f"{tmp}/own.jsonl", LR="8e-4")
    b = launch("b", INIT_FROM=f"{tmp}/a", STEPS="2", DATASET=f"{tmp}/own.parquet", EXTRA_ARGS=ZERO_LR)
    return source, a, b


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    return runs(str(tmp_path_factory.mktemp("finetune")))


def tensors(folder):
    from safetensors.torch import load_file

    return load_file(f"{folder}/model.safetensors")


def titan_logits(folder, tokens):
    """torchtitan's native smoke model with the folder's weights, through the Qwen3 state-dict adapter."""
    from neuron_qwen3 import config_registry

    config = config_registry.native_qwen3_smoke()
    model = config.model_spec.model.build()
    adapter = config.model_spec.state_dict_adapter(config.model_spec.model, None)
    model.load_state_dict(adapter.from_hf(tensors(folder)), strict=True)
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    with torch.no_grad():
        return model(tokens, attention_masks=model.get_attention_masks(positions), positions=positions)


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


TOKENS = torch.randint(0, 2048, (2, 64), generator=torch.Generator().manual_seed(0))


def test_runs_finish_and_export(done):
    source, a, b = done
    for result in (a, b):
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(losses(a)) == list(range(1, 9)) and sorted(losses(b)) == [1, 2]
    for result in (a, b):  # INIT_FROM by hf/load.py, not torchtitan's initial load (the round trip below: exact)
        assert "Loaded the Hugging Face weights of" in result.stdout + result.stderr


def test_same_function_as_transformers(done):
    import transformers

    source = done[0]
    reference = transformers.AutoModelForCausalLM.from_pretrained(source)
    with torch.no_grad():
        expected = reference(TOKENS).logits
    assert rel_err(titan_logits(source, TOKENS), expected) <= 1e-5


def test_round_trip_keeps_every_tensor(done):
    source, a, b = done
    exported, reloaded = tensors(f"{source}/../a"), tensors(f"{source}/../b")
    assert set(tensors(source)) == set(exported) == set(reloaded)  # no key lost (tied lm_head stays out)
    for key in exported:  # B loaded A's export and, at learning rate 0, exported it unchanged
        assert torch.equal(exported[key], reloaded[key]), key
    assert any(not torch.equal(exported[k], tensors(source)[k]) for k in exported)  # A did train


def test_continuity_second_run_starts_where_the_first_ended(done):
    _, a, b = done
    first, second = losses(a), losses(b)
    assert first[8] < first[1] - 0.5, first  # trained away from the random start
    assert second[1] == pytest.approx(first[8], abs=0.3), (first, second)
    assert second[1] < first[1] - 0.5


def test_served_as_is_by_transformers(done):
    import transformers

    folder = f"{done[0]}/../a"
    config = json.loads(open(f"{folder}/config.json").read())
    # the dtype under the source's name (transformers 5 writes `dtype`)
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["dtype"] == "float32"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    prompt = tokenizer("The quiet cat reads", return_tensors="pt")
    generated = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] == prompt["input_ids"].shape[1] + 4
    with torch.no_grad():
        served = model(TOKENS).logits
    assert rel_err(titan_logits(folder, TOKENS), served) <= 1e-5
