"""LoRA fine-tuning proofs against PEFT and transformers, through the launcher on CPU.

Real launcher runs at smoke scale, shared by every test here, over random models that transformers made and saved:
  dense:    VARIANT=native, LORA_RANK=4 LORA_ALPHA=16, 8 steps, CHECKPOINT_DIR, EXPORT_MERGED=1 (float32)
  moe:      VARIANT=nki_moe, NPROC=2 (FSDP), attention and both expert targets, 6 steps, CHECKPOINT_DIR (step 1 too),
            EXPORT_MERGED=1
  v5:       VARIANT=v5, LORA_RANK=4, 6 steps, CHECKPOINT_DIR, the adapter folder alone
  continue: INIT_FROM = the dense run's adapter folder, learning rate 0, 2 steps
  other:    the dense run's CHECKPOINT_DIR resumed over another base of the same shape (PREFLIGHT=warn: the
            pre-launch pass names it, the workers refuse it)
The trained torchtitan model of a run is its final checkpoint's adapters over the source, built in process. That
B = 0 leaves the base model's function at the start is test_lora.py's, in process, for each variant; that the run
trained over the source's very weights is PEFT's logits and merge below.
Run: flock /tmp/neuron-qwen3-heavy.lock .venv/bin/python -m pytest tests/test_lora_finetune.py -q
"""

import functools
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import ANSI, REPO, STEP_LOSS, meta_model, side_by_side_env

pytestmark = pytest.mark.training
ZERO_LR = "--tune.lr 0"  # the weights stay: a round trip
FIRST_STEP = "--checkpoint.enable_first_step_checkpoint"  # A as drawn: B = 0 gives it no gradient in step 1
LR = "8e-4"  # the smoke config's, not the full fine-tuning default (2e-5): the adapters move in 6-8 steps
MOE_TARGETS = "q_proj,k_proj,v_proj,o_proj,experts.gate_up_proj,experts.down_proj"
SETTINGS = {
    "dense": dict(rank=4, alpha=16),
    "moe": dict(rank=4, targets=MOE_TARGETS),
    "v5": dict(rank=4),
}
VARIANT = {"dense": "native", "moe": "nki_moe", "v5": "v5"}
SOURCE = {"dense": "dense-source", "moe": "moe-source", "v5": "dense-source"}


def losses(result) -> dict:
    """{step: loss as printed}."""
    return {int(s): v for s, v in STEP_LOSS.findall(ANSI.sub("", result.stdout + result.stderr))}


def tensors(path):
    from safetensors.torch import load_file

    return load_file(path)


def save_dense(folder, seed=0):
    import transformers

    from neuron_qwen3 import config_registry

    torch.manual_seed(seed)
    shape = json.loads((config_registry.HF_MODEL["smoke"] / "config.json").read_text())
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**shape)).save_pretrained(folder)


def moe_config(compute_dtype="bfloat16"):
    """The nki_moe smoke config as a run loading HF weights builds it; its experts computed in `compute_dtype`."""
    from neuron_qwen3 import config_registry
    from neuron_qwen3.hf import weights

    config = config_registry.nki_moe_qwen3_smoke()
    config.checkpoint.initial_load_in_hf = True
    weights.hf_compatible(config)
    config.override.imports = [("neuron_qwen3.moe.experts.nki_grouped_experts", {"compute_dtype": compute_dtype})]
    return config


def save_moe(folder):
    import transformers

    from neuron_qwen3.hf import weights

    torch.manual_seed(0)
    shape = weights.native_hf_config(moe_config().model_spec.model, {})
    transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**shape)).save_pretrained(folder)


@functools.cache
def runs(tmp):
    save_dense(f"{tmp}/dense-source")
    save_dense(f"{tmp}/dense-source2", seed=1)
    save_moe(f"{tmp}/moe-source")

    def launch(name, variant, **env):
        env = side_by_side_env(
            VARIANT=variant,
            SCALE="smoke",
            OUTPUT_DIR=f"{tmp}/{name}-out",
            CACHE_DIR=f"{tmp}/cache",
            EXPORT_DTYPE="float32",
            **env,
        )
        return subprocess.run(
            [sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
        )

    def dense():
        """The dense run, then the two that start from its adapter and its checkpoint."""
        found = {
            "dense": launch(
                "dense",
                "native",
                INIT_FROM=f"{tmp}/dense-source",
                LORA_RANK="4",
                LORA_ALPHA="16",
                LR=LR,
                STEPS="8",
                CHECKPOINT_DIR=f"{tmp}/dense-checkpoint",
                EXPORT_DIR=f"{tmp}/dense",
                EXPORT_MERGED="1",
            )
        }
        found["continue"] = launch(
            "continue",
            "native",
            INIT_FROM=f"{tmp}/dense/adapter",
            STEPS="2",
            EXPORT_DIR=f"{tmp}/continue",
            EXTRA_ARGS=ZERO_LR,
        )
        shutil.copytree(f"{tmp}/dense-checkpoint", f"{tmp}/other-checkpoint")
        found["other"] = launch(
            "other",
            "native",
            INIT_FROM=f"{tmp}/dense-source2",
            LORA_RANK="4",
            LORA_ALPHA="16",
            STEPS="10",
            CHECKPOINT_DIR=f"{tmp}/other-checkpoint",
            PREFLIGHT="warn",
        )
        return found

    def moe():
        return {
            "moe": launch(
                "moe",
                "nki_moe",
                NPROC="2",
                INIT_FROM=f"{tmp}/moe-source",
                LORA_RANK="4",
                LR=LR,
                LORA_TARGETS=MOE_TARGETS,
                STEPS="6",
                CHECKPOINT_DIR=f"{tmp}/moe-checkpoint",
                EXPORT_DIR=f"{tmp}/moe",
                EXPORT_MERGED="1",
                EXTRA_ARGS=FIRST_STEP,
            )
        }

    def v5():
        return {
            "v5": launch(
                "v5",
                "v5",
                INIT_FROM=f"{tmp}/dense-source",
                LORA_RANK="4",
                STEPS="6",
                LR=LR,
                CHECKPOINT_DIR=f"{tmp}/v5-checkpoint",
                EXPORT_DIR=f"{tmp}/v5",
            )
        }

    # two at a time: independent launches, mostly imports on one core
    with ThreadPoolExecutor(2) as pool:
        return {
            "tmp": tmp,
            **{name: run for found in pool.map(lambda chain: chain(), (dense, moe, v5)) for name, run in found.items()},
        }


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    return runs(str(tmp_path_factory.mktemp("lora")))


def final_checkpoint(done, name) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    steps = max(losses(done[name]))
    out = f"{done['tmp']}/{name}-final.pt"
    if not os.path.exists(out):
        dcp_to_torch_save(f"{done['tmp']}/{name}-checkpoint/step-{steps}", out)
    return torch.load(out, weights_only=False)


def smoke_meta_model(name) -> tuple:
    """(config, model config, model on the meta device) of `name`'s smoke run, as its trainer builds them."""
    from neuron_qwen3 import config_registry

    config = moe_config("float32") if name == "moe" else getattr(config_registry, f"{VARIANT[name]}_qwen3_smoke")()
    return config, *meta_model(config)


def trained_titan(done, name):
    """The run's trained model: its variant's smoke model over the source weights, its adapters from the final
    checkpoint (fp32, MoE experts in fp32)."""
    from neuron_qwen3.lora import adapters, targets
    from neuron_qwen3.quirks import hf_rope_fix
    from neuron_qwen3.settings import Lora

    if name == "v5":
        hf_rope_fix.apply()  # as the v5 trainer does before it builds the model
    config, model_config, model = smoke_meta_model(name)
    adapters.insert(model, Lora(**SETTINGS[name]), targets.family_of(model_config))
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    adapter = config.model_spec.state_dict_adapter(model_config, None)
    base = adapter.from_hf(tensors(f"{done['tmp']}/{SOURCE[name]}/model.safetensors"))
    trained = {k: v for k, v in final_checkpoint(done, name).items() if adapters.is_adapter_key(k)}
    result = model.load_state_dict({**base, **trained}, strict=False)
    assert not result.unexpected_keys and not [k for k in result.missing_keys if adapters.is_adapter_key(k)]
    return model


def one_rank_adapters(name) -> dict:
    """The adapters a 1-rank CPU run of `name` starts from: its smoke model built and initialised in process as the
    trainer does (the smoke seed, wrap_parallelize's init; FSDP left out), {torchtitan key: A}."""
    from types import SimpleNamespace

    from neuron_qwen3.lora import adapters, targets
    from neuron_qwen3.settings import Lora

    config, model_config, model = smoke_meta_model(name)
    parallelize = adapters.wrap_parallelize(
        lambda model, **_: model, Lora(**SETTINGS[name]), targets.family_of(model_config)
    )
    no_tp_ep_pp = SimpleNamespace(tp_enabled=False, ep_enabled=False, pp_enabled=False)
    model = parallelize(model, parallel_dims=no_tp_ep_pp)
    model.to_empty(device="cpu")
    torch.manual_seed(config.debug.seed)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return {key: value for key, value in model.state_dict().items() if key.endswith(".lora_A")}


def titan_logits(model, tokens):
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    masks = {} if hasattr(model, "model") else {"attention_masks": model.get_attention_masks(positions)}
    with torch.no_grad():
        return model(tokens, positions=positions, **masks)


def adapter_folder(done, name):
    return f"{done['tmp']}/{name}" + ("/adapter" if name in ("dense", "moe") else "")


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


TOKENS = torch.randint(0, 2048, (2, 64), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", ["dense", "moe", "v5", "continue"])
def test_runs_finish(done, name):
    result = done[name]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = {"dense": 8, "moe": 6, "v5": 6, "continue": 2}[name]
    found = losses(result)
    assert sorted(found) == list(range(1, steps + 1))
    assert "LoRA: loading the frozen base from" in result.stdout + result.stderr
    if name != "continue":  # learning rate 0 there
        assert found[steps] != found[1]  # it trained


@pytest.mark.parametrize("name", ["dense", "moe", "v5"])
def test_peft_computes_the_trained_models_logits(done, name):
    import peft
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(f"{done['tmp']}/{SOURCE[name]}")
    served = peft.PeftModel.from_pretrained(base, adapter_folder(done, name))
    with torch.no_grad():
        theirs = served(TOKENS).logits
        with served.disable_adapter():
            untouched = served(TOKENS).logits
    ours = titan_logits(trained_titan(done, name), TOKENS)
    print(
        f"\n{name}: |ours - PEFT| / |PEFT| = {rel_err(ours, theirs):.2e}; the adapter moves the logits by "
        f"{rel_err(untouched, theirs):.2e}"
    )
    assert rel_err(untouched, theirs) > 1e-3  # the adapter trained: the comparison can fail
    assert rel_err(ours, theirs) <= 1e-5


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_merge_and_unload_is_the_merged_export_and_the_base_did_not_move(done, name, tmp_path):
    import peft
    import transformers

    source = f"{done['tmp']}/{SOURCE[name]}"
    served = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(source), adapter_folder(done, name)
    )
    served.merge_and_unload().save_pretrained(tmp_path)  # transformers writes Qwen3-MoE experts one by one again
    theirs, ours = tensors(f"{tmp_path}/model.safetensors"), tensors(f"{done['tmp']}/{name}/model.safetensors")
    assert sorted(ours) == sorted(theirs)
    assert [key for key in ours if not torch.equal(ours[key], theirs[key])] == []
    # PEFT merged the exported adapter into the SOURCE: so every base tensor the run held was the source's, bit for
    # bit; what differs from the source is exactly the adapted weights
    adapted = {
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    original = tensors(f"{source}/model.safetensors")
    changed = {key for key in ours if not torch.equal(ours[key], original[key])}
    expected = {
        key
        for key in ours
        if any(key.endswith(f".{part}.weight") for part in adapted) and ".mlp.gate.weight" not in key
    }
    assert changed == expected


@pytest.mark.parametrize("name", ["dense", "moe", "v5"])
def test_checkpoints_hold_the_adapters_and_their_optimizer_only(done, name):
    from neuron_qwen3.lora import adapters, base_check

    state = final_checkpoint(done, name)
    model = [key for key, value in state.items() if isinstance(value, torch.Tensor)]
    assert model and all(adapters.is_adapter_key(key) for key in model), [
        k for k in model if not adapters.is_adapter_key(k)
    ]
    optimizer = [key for key in state["optimizer"] if key.startswith("state.")]
    assert optimizer and all(key.removeprefix("state.").rsplit(".", 1)[0] in model for key in optimizer)
    assert state[base_check.BASE_STATE] == base_check.base_fingerprint(f"{done['tmp']}/{SOURCE[name]}")


def test_the_adapters_start_as_on_one_rank(done):
    """On 2 ranks (FSDP shards A by rows) the run starts from the very A a 1-rank run draws: CPU has no DTensor RNG
    tracker, and a shard drawn per rank from the ranks' alike-seeded generators repeated the other rank's rows.
    After step 1 A is still as drawn, but for the weight decay's factor: B = 0 gives it no gradient."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = f"{done['tmp']}/moe-step-1.pt"
    dcp_to_torch_save(f"{done['tmp']}/moe-checkpoint/step-1", out)
    first = {key: value for key, value in torch.load(out, weights_only=False).items() if key.endswith(".lora_A")}
    drawn = one_rank_adapters("moe")
    assert sorted(first) == sorted(drawn) and len(drawn) == 2 * 6
    for key, a in first.items():
        half = a.shape[0] // 2
        assert not torch.equal(a[:half], a[half:]), f"{key}: the two ranks' rows are one draw"
        factor = (a * drawn[key]).sum() / drawn[key].square().sum()
        torch.testing.assert_close(a, factor * drawn[key], rtol=1e-6, atol=0, msg=key)
        assert abs(factor - 1) < 1e-3


def test_the_export_is_a_peft_adapter_folder(done):
    folder = adapter_folder(done, "moe")
    config = json.loads(open(f"{folder}/adapter_config.json").read())
    assert config["base_model_name_or_path"] == f"{done['tmp']}/moe-source"
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8, "LORA")
    assert config["target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert config["target_parameters"] == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    assert {"tokenizer.json", "tokenizer_config.json", "adapter_model.safetensors"} <= set(os.listdir(folder))
    keys = tensors(f"{folder}/adapter_model.safetensors")
    assert all(key.startswith("base_model.model.model.layers.") for key in keys)
    assert "base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight" in keys  # gate_up inside down


def test_an_adapter_folder_continues_training(done):
    output = done["continue"].stdout + done["continue"].stderr
    assert f"continuing the adapter of {done['tmp']}/dense/adapter (14 adapters)" in output
    before = tensors(f"{done['tmp']}/dense/adapter/adapter_model.safetensors")
    after = tensors(f"{done['tmp']}/continue/adapter_model.safetensors")  # learning rate 0: the same adapter
    assert sorted(before) == sorted(after) and all(torch.equal(before[k], after[k]) for k in before)
    assert json.loads(open(f"{done['tmp']}/continue/adapter_config.json").read())["lora_alpha"] == 16


def test_a_resume_over_another_base_is_refused_in_one_line(done):
    """The pre-launch pass names it (PREFLIGHT=warn lets the launch go on), and the workers refuse it too."""
    from neuron_qwen3.lora import base_check

    result = done["other"]
    step = f"{done['tmp']}/other-checkpoint/step-8"
    said = [line for line in result.stderr.splitlines() if line.startswith("entrypoint: warning: CHECKPOINT_DIR")]
    assert len(said) == 1 and said[0].startswith(
        f"entrypoint: warning: CHECKPOINT_DIR {step}: the checkpoint's adapters were trained over a base of"
    ), result.stderr[-3000:]
    assert result.returncode != 0
    lines = {
        line.split("LoRAError: ", 1)[1]
        for line in (result.stdout + result.stderr).splitlines()
        if "LoRAError: " in line
    }
    assert len(lines) == 1 and "trained over a base of" in lines.pop()
    assert base_check.check_resume_base(step, f"{done['tmp']}/dense-source") == []
