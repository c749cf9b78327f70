"""The MoE router settings: MOE_AUX_LOSS and MOE_Z_LOSS as finish() resolves them, and MOE_ROUTER=freeze for real.

In process, no training (the finished config: prelaunch/preflight.py `parse_config`, then finish.py `finish`):
- MOE_AUX_LOSS unset is INIT_FROM's config.json router_aux_loss_coef (0.02 written here), Qwen3-MoE's 0.001
  without INIT_FROM, 0 on a dense config (native and v5); a value given (0: off) is kept, whatever INIT_FROM says;
- a negative, NaN or infinite coefficient (`--moe.aux_loss`, `--moe.z_loss`) is one line, from finish as from the
  launcher's pre-launch pass; through the launcher MOE_AUX_LOSS=-1 and MOE_ROUTER=thaw are one line and exit 2
  (every bad form of the variables: tests/test_entrypoint_contract.py's table);
- `routing.freeze` on the nki_moe smoke model takes exactly the routers' parameters out of the gradient, and no
  LoRA target names the router.
In a fresh interpreter (a 1-rank gloo group, the CPU device set up as a worker does): the finished nki_moe smoke
config's parallelize_fn, the spec's real one (FSDP, activation checkpointing), then torchtitan's optimizer on the
model: with --moe.router=freeze every router parameter has requires_grad False after it and none is in the
optimizer; without it they train; LoRA alone freezes them too.
Two real launcher runs, at once: VARIANT=nki_moe SCALE=smoke, INIT_FROM a random Qwen3MoeForCausalLM saved by
transformers, STEPS=3, LR=1e-3 (the weights move visibly), MOE_ROUTER=freeze, EXPORT_DTYPE=float32:
  freeze: CHECKPOINT_DIR; INIT_FROM's config.json says router_aux_loss_coef 0.02 -> the routers
          (`model.layers.N.mlp.gate.weight`) in the export and in the final checkpoint are bitwise INIT_FROM's,
          the optimizer holds no state for them, experts and attention moved; the workers trained with 0.02;
  lora:   LORA_RANK=4 on q_proj, v_proj and both expert projections, EXPORT_MERGED=1 -> the merged model's routers
          are bitwise INIT_FROM's while the adapted weights moved; the adapter (EXPORT_DIR/adapter) has no
          router key.
Run: .venv/bin/python -m pytest tests/test_moe_router.py -q   (about 1-2 min on a busy 2-core CPU machine)
"""

import functools
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import ANSI, REPO, STEP_LOSS, folder_tensors, recipes_pass, side_by_side_env, worker_env

STEPS, LR = 3, "1e-3"
SOURCE_AUX = 0.02  # written into the freeze run's INIT_FROM config.json: Qwen3-MoE's own is 0.001
LORA_TARGETS = "q_proj,v_proj,experts.gate_up_proj,experts.down_proj"
ROUTER = "mlp.gate.weight"  # a Qwen3-MoE router's weight in Hugging Face's names (model.layers.N.mlp.gate.weight)


def parsed(config="nki_moe_qwen3_smoke", *flags):
    from neuron_qwen3.prelaunch import preflight

    config, problem = preflight.parse_config(["--module", "neuron_qwen3", "--config", config, *flags], {})
    assert problem is None, problem
    return config


def finished(config="nki_moe_qwen3_smoke", *flags):
    from neuron_qwen3.finish import finish

    config = parsed(config, *flags)
    finish(config, 1, "cpu")
    return config


def hf_folder(folder, **fields) -> str:
    """What finish reads of INIT_FROM: a config.json (Qwen3-MoE's type, `fields`)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "qwen3_moe", **fields}, f)
    return str(folder)


def init_from(folder) -> tuple:
    return f"--checkpoint.initial_load_path={folder}", "--checkpoint.initial_load_in_hf"


# ---- MOE_AUX_LOSS, MOE_Z_LOSS: what finish resolves -----------------------------------------------------------


def test_the_aux_coefficient_unset_is_init_froms_router_aux_loss_coef_else_qwen3_moes(tmp_path):
    source = hf_folder(tmp_path / "source", router_aux_loss_coef=SOURCE_AUX)
    assert finished("nki_moe_qwen3_smoke", *init_from(source)).moe.aux_loss == SOURCE_AUX
    assert finished("nki_moe_qwen3_smoke").moe.aux_loss == 0.001  # Qwen3-MoE's router_aux_loss_coef
    silent = hf_folder(tmp_path / "silent")  # a config.json without the field
    assert finished("nki_moe_qwen3_smoke", *init_from(silent)).moe.aux_loss == 0.001
    given = finished("nki_moe_qwen3_smoke", *init_from(source), "--moe.aux_loss=0", "--moe.z_loss=0.001").moe
    assert (given.aux_loss, given.z_loss, given.router) == (0.0, 0.001, "train")  # 0 is off, not "unset"


@pytest.mark.parametrize("config", ["native_qwen3_smoke", "v5_qwen3_smoke"])
def test_a_dense_model_has_no_aux_loss(config):
    assert finished(config).moe.aux_loss == 0.0


@pytest.mark.parametrize("flag", ["--moe.aux_loss=-1", "--moe.z_loss=-1", "--moe.aux_loss=nan", "--moe.z_loss=inf"])
def test_a_bad_coefficient_is_one_line_from_the_moe_section(flag):
    """settings.Moe refuses it as the flags parse, before finishing reads it."""
    from neuron_qwen3.prelaunch import preflight

    config, problem = preflight.parse_config(["--module", "neuron_qwen3", "--config", "nki_moe_qwen3_smoke", flag], {})
    name, value = flag.split("=")
    assert config is None and problem == f"{name}={float(value)} is not a coefficient from 0"


def test_the_pre_launch_pass_says_a_bad_coefficient_in_one_line(tmp_path):
    """EXTRA_ARGS=--moe.aux_loss=-1 (past the contract, which checks MOE_AUX_LOSS): the launcher's pre-launch answer."""
    answer = recipes_pass(tmp_path, VARIANT="nki_moe", EXTRA_ARGS="--moe.aux_loss=-1")
    assert answer["problems"] == ["--moe.aux_loss=-1.0 is not a coefficient from 0"], answer["problems"]


@pytest.mark.parametrize(
    "env, says",
    [
        ({"MOE_AUX_LOSS": "-1"}, "MOE_AUX_LOSS='-1' is not a number from 0, like 0.001"),
        ({"MOE_ROUTER": "thaw"}, "MOE_ROUTER='thaw' is not one of: train, freeze"),
    ],
)
def test_the_launcher_refuses_a_bad_value_in_one_line_and_exit_2(tmp_path, env, says):
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.environ["PYTHONPATH"],
        "SCALE": "smoke",
        "VARIANT": "nki_moe",
        "OUTPUT_DIR": str(tmp_path / "out"),
        "CACHE_DIR": str(tmp_path / "cache"),
        **env,
    }
    result = subprocess.run(
        [sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"entrypoint: {says}\n")
    assert not (tmp_path / "out").exists()  # nothing started


# ---- MOE_ROUTER=freeze: the model ----------------------------------------------------------------------------


def test_freeze_takes_the_routers_and_nothing_else_out_of_the_gradient():
    from torchtitan.config.override import apply_overrides

    from neuron_qwen3.moe import routing

    config = parsed()
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    apply_overrides(config.override, config)
    with torch.device("meta"):
        model = model_config.build()
    routers = {name for name, _ in model.named_parameters() if ".router." in name}
    assert routers == {f"layers.{i}.moe.router.gate.weight" for i in range(len(routing.moe_layers(model)))} != set()
    routing.freeze(model)
    assert {name for name, p in model.named_parameters() if not p.requires_grad} == routers


def test_no_lora_target_names_the_router():
    from neuron_qwen3.lora import targets

    assert not [target for target in targets.TARGETS["moe"] if target in ("gate", "router", "mlp.gate")]


# The finished config's parallelize_fn and optimizer, as the trainer calls them (torchtitan trainer.py), in a fresh
# interpreter: the process group and the device choice (quirks/devices.py) are process-global.
PARALLELIZED = r"""
import json, sys
import torch
import torch.distributed as dist
from torchtitan.config.override import apply_overrides
from torchtitan.distributed import ParallelDims
from neuron_qwen3.finish import finish
from neuron_qwen3.moe import routing
from neuron_qwen3.prelaunch import preflight
from neuron_qwen3.quirks import devices

devices.set_up("cpu")
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
found = {}
for name, flags in json.loads(sys.argv[1]).items():
    args = ["--module", "neuron_qwen3", "--config", "nki_moe_qwen3_smoke", *flags]
    config, problem = preflight.parse_config(args, {})
    assert problem is None, problem
    finish(config, 1, "cpu")
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    apply_overrides(config.override, config)
    with torch.device("meta"):
        model = model_config.build()
    model = config.model_spec.parallelize_fn(
        model, parallel_dims=ParallelDims.from_config(config.parallelism, 1), training=config.training,
        parallelism=config.parallelism, compile_config=config.compile, ac_config=config.activation_checkpoint,
        dump_folder=config.dump_folder)
    model.to_empty(device="cpu")
    routers = [p for layer in routing.moe_layers(model) for p in layer.router.parameters()]
    optimized = {id(p) for optimizer in config.optimizer.build(model_parts=[model]) for group in optimizer.param_groups
                 for p in group["params"]}
    others = [p for p in model.parameters() if all(p is not r for r in routers)]
    found[name] = {"routers": len(routers), "router_grad": [p.requires_grad for p in routers],
                   "router_optimized": [id(p) in optimized for p in routers],
                   "others_trainable": sum(p.requires_grad for p in others), "others": len(others)}
dist.destroy_process_group()
print(json.dumps(found))
"""


@pytest.mark.training
def test_the_finished_parallelize_fn_freezes_the_routers_out_of_the_optimizer(tmp_path):
    source = hf_folder(tmp_path / "source")
    cases = {
        "freeze": ["--moe.router=freeze"],
        "train": [],
        "lora": [*init_from(source), "--lora.rank=4"],
        "lora+freeze": [*init_from(source), "--lora.rank=4", "--moe.router=freeze"],
    }
    result = subprocess.run(
        [sys.executable, "-c", PARALLELIZED, json.dumps(cases)],
        env=worker_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    for name, case in found.items():
        assert case["routers"] == 2, (name, case)  # the smoke model's two MoE layers
    freeze, train = found["freeze"], found["train"]
    assert freeze["router_grad"] == freeze["router_optimized"] == [False, False]
    assert freeze["others_trainable"] == freeze["others"]  # the experts, attention, norms, embeddings still train
    assert train["router_grad"] == train["router_optimized"] == [True, True]
    for name in ("lora", "lora+freeze"):  # LoRA trains adapters alone: the routers are base weights
        assert found[name]["router_grad"] == found[name]["router_optimized"] == [False, False], found[name]
        assert 0 < found[name]["others_trainable"] < found[name]["others"]


# ---- MOE_ROUTER=freeze: real runs ------------------------------------------------------------------------------


def losses(result) -> dict:
    return {int(step): float(loss) for step, loss in STEP_LOSS.findall(ANSI.sub("", result.stdout + result.stderr))}


@functools.cache
def runs(tmp):
    from test_finetune_variants import save_moe

    save_moe(f"{tmp}/source")
    save_moe(f"{tmp}/source-aux")  # the same weights (seed 0); its config.json names another coefficient
    path = f"{tmp}/source-aux/config.json"
    shape = json.loads(open(path).read())
    assert shape["router_aux_loss_coef"] == 0.001  # transformers' Qwen3MoeConfig default, as the released models
    with open(path, "w") as f:
        json.dump({**shape, "router_aux_loss_coef": SOURCE_AUX}, f)

    def launch(name, **env):
        env = side_by_side_env(
            VARIANT="nki_moe",
            SCALE="smoke",
            STEPS=str(STEPS),
            LR=LR,
            MOE_ROUTER="freeze",
            OUTPUT_DIR=f"{tmp}/{name}-out",
            CACHE_DIR=f"{tmp}/cache-{name}",
            EXPORT_DIR=f"{tmp}/{name}",
            EXPORT_DTYPE="float32",
            **env,
        )
        return subprocess.run(
            [sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
        )

    # at once: their imports (most of their time, one core each) share the cores
    with ThreadPoolExecutor(2) as pool:
        freeze = pool.submit(launch, "freeze", INIT_FROM=f"{tmp}/source-aux", CHECKPOINT_DIR=f"{tmp}/checkpoint")
        lora = pool.submit(
            launch, "lora", INIT_FROM=f"{tmp}/source", LORA_RANK="4", LORA_TARGETS=LORA_TARGETS, EXPORT_MERGED="1"
        )
        return {"tmp": tmp, "freeze": freeze.result(), "lora": lora.result()}


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    return runs(str(tmp_path_factory.mktemp("router")))


def moved(before: dict, after: dict) -> set:
    return {key for key, value in before.items() if not torch.equal(value, after[key])}


@pytest.mark.training
@pytest.mark.parametrize("name", ["freeze", "lora"])
def test_runs_finish(done, name):
    result = done[name]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(losses(result)) == list(range(1, STEPS + 1))


@pytest.mark.training
def test_frozen_routers_are_init_froms_bit_for_bit_while_the_rest_trains(done):
    tmp = done["tmp"]
    source, export = folder_tensors(f"{tmp}/source-aux"), folder_tensors(f"{tmp}/freeze")
    assert sorted(source) == sorted(export)
    routers = {key for key in source if key.endswith(ROUTER)}
    assert len(routers) == 2
    changed = moved(source, export)
    assert not changed & routers, sorted(changed & routers)
    assert any(".mlp.experts." in key for key in changed) and any(".self_attn." in key for key in changed), changed
    # the workers trained with INIT_FROM's coefficient, the routers frozen
    worker = json.loads(open(f"{tmp}/freeze-out/report/config.json").read())
    assert worker["moe"] == {"aux_loss": SOURCE_AUX, "z_loss": 0.0, "router": "freeze"}


@pytest.mark.training
def test_the_final_checkpoint_holds_init_froms_routers_and_no_optimizer_state_for_them(done):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    tmp = done["tmp"]
    dcp_to_torch_save(f"{tmp}/checkpoint/step-{STEPS}", f"{tmp}/final.pt")
    state = torch.load(f"{tmp}/final.pt", weights_only=False)
    source = folder_tensors(f"{tmp}/source-aux")
    for i in range(2):  # torchtitan's router key is Hugging Face's, renamed, untransformed
        assert torch.equal(state[f"layers.{i}.moe.router.gate.weight"], source[f"model.layers.{i}.{ROUTER}"])
    optimizer = state["optimizer"]
    assert not [key for key in optimizer if ".router." in key]
    assert [key for key in optimizer if key.startswith("state.") and ".moe.routed_experts." in key]


@pytest.mark.training
def test_lora_never_adapts_the_router_and_the_merged_model_keeps_it(done):
    tmp = done["tmp"]
    source, merged = folder_tensors(f"{tmp}/source"), folder_tensors(f"{tmp}/lora")
    assert sorted(source) == sorted(merged)
    changed = moved(source, merged)
    routers = {key for key in source if key.endswith(ROUTER)}
    assert len(routers) == 2 and not changed & routers, sorted(changed & routers)
    # what LoRA adapted moved in the merge (q_proj, v_proj, the experts); what it did not is the source's
    assert any(".mlp.experts." in key for key in changed) and any("q_proj" in key for key in changed), changed
    assert all(("q_proj" in key or "v_proj" in key or ".mlp.experts." in key) for key in changed), changed
    adapter = folder_tensors(f"{tmp}/lora/adapter")
    assert adapter and not [key for key in adapter if ".mlp.gate." in key or ".router." in key], sorted(adapter)
    adapter_config = json.loads(open(f"{tmp}/lora/adapter/adapter_config.json").read())
    named = [*(adapter_config.get("target_modules") or []), *(adapter_config.get("target_parameters") or [])]
    assert named and not [target for target in named if target.split(".")[-1] == "gate"], named
