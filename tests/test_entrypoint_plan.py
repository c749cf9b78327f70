"""From settings and devices to the torchrun command and environment: the article's launch on every platform.

Run: .venv/bin/python -m pytest tests/test_entrypoint_plan.py -q
"""

import os
import sys
from pathlib import Path

import pytest

from entrypoint import contract, plan
from entrypoint.discovery import Devices
from entrypoint.variants import RECIPE_MODULE, SCALES, VARIANTS

DEVICES = {"neuron": Devices("neuron", 64, tuple(f"neuron{i}" for i in range(16)), 2),
           "cuda": Devices("cuda", 8, tuple(f"nvidia{i}" for i in range(8))),
           "cpu": Devices("cpu", os.cpu_count())}
ARTICLE = ["--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", "--local-ranks-filter", "0", "--role", "rank",
           "--tee", "3"]


def build(kind, environ=None, **env):
    environ = {**(environ or {}), **env}
    return plan.build(contract.parse(environ), DEVICES[kind], environ)


def after(argv, flag):
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("kind", DEVICES)
@pytest.mark.parametrize("variant", VARIANTS.values(), ids=list(VARIANTS))
@pytest.mark.parametrize("scale", SCALES)
def test_article_launch_for_every_platform_variant_and_scale(kind, variant, scale):
    p = build(kind, VARIANT=variant.name, SCALE=scale)
    nproc = 1 if kind == "cpu" else DEVICES[kind].count
    worker = {"cpu": "neuron_qwen3.cpu_worker", "neuron": "neuron_qwen3.neuron_worker"}.get(kind, "neuron_qwen3.trainer")
    assert list(p.argv[:16]) == [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", *ARTICLE,
                                 "-m", worker]
    assert p.argv[16:20] == ("--module", RECIPE_MODULE, "--config", variant.configs[scale])
    assert (p.variant, p.scale, p.module, p.config, p.nproc) == (variant.name, scale, RECIPE_MODULE,
                                                                  variant.configs[scale], nproc)
    assert after(p.argv, "--dump_folder") == "./outputs"
    if scale == "full":
        assert after(p.argv, "--hf_assets_path") == f"./assets/hf/{variant.hf_repo.split('/')[-1]}"
    else:
        assert "--hf_assets_path" not in p.argv
        assert p.env["HF_HUB_OFFLINE"] == p.env["HF_DATASETS_OFFLINE"] == "1"
    assert "--compile.enable" not in p.argv and "--training.steps" not in p.argv


@pytest.mark.parametrize("kind, backend", [("neuron", "neuron"), ("cuda", "inductor"), ("cpu", "inductor")])
def test_compile_backend_per_platform(kind, backend):
    argv = build(kind, COMPILE="on").argv
    assert argv[argv.index("--compile.enable") + 1:][:2] == ("--compile.backend", backend)


def test_steps_paths_and_extra_args_last():
    argv = build("cuda", STEPS="7", ASSETS_DIR="/a", OUTPUT_DIR="/o", EXTRA_ARGS="--x.y 1 --z 'a b'").argv
    assert after(argv, "--training.steps") == "7"
    assert after(argv, "--hf_assets_path") == "/a/Qwen3-4B"
    assert after(argv, "--dump_folder") == "/o"
    assert argv[-4:] == ("--x.y", "1", "--z", "a b")


def test_environment_on_each_platform():
    repo = Path(plan.__file__).resolve().parent.parent
    recipes = os.pathsep.join([str(repo / "recipes"), str(repo)])  # the recipes, and entrypoint.names for them
    cache = os.path.abspath("./cache/native")  # one folder per variant
    neuron = build("neuron", NEURON_RT_VISIBLE_CORES="0-63").env
    assert neuron == {"PYTHONPATH": recipes, "PYTHONUNBUFFERED": "1", "NEURON_LOGICAL_NC_CONFIG": "2",
                      "NEURON_RT_VISIBLE_CORES": "0-63", "TORCH_NEURONX_NEFF_CACHE_DIR": f"{cache}/neff",
                      "TORCH_NEURONX_HLO_CACHE_DIR": f"{cache}/hlo", "NKI_COMPILE_CACHE_URL": f"{cache}/nki"}
    assert build("cuda", CACHE_DIR="/c", VARIANT="v5").env == {"PYTHONPATH": recipes, "PYTHONUNBUFFERED": "1",
                                                               "NEURON_QWEN3_DEVICE": "cuda",
                                                               "TORCHINDUCTOR_CACHE_DIR": "/c/v5/inductor"}
    cpu = build("cpu", NPROC="1").env
    assert (cpu["NEURON_QWEN3_DEVICE"], cpu["OMP_NUM_THREADS"]) == ("cpu", str(os.cpu_count()))


def test_variables_already_set_are_kept():
    env = build("neuron", PYTHONPATH="/mine", TORCH_NEURONX_NEFF_CACHE_DIR="/n", NKI_COMPILE_CACHE_URL="/k").env
    assert env["PYTHONPATH"].split(os.pathsep)[2:] == ["/mine"]
    assert "TORCH_NEURONX_NEFF_CACHE_DIR" not in env and "NKI_COMPILE_CACHE_URL" not in env
    assert "OMP_NUM_THREADS" not in build("cpu", OMP_NUM_THREADS="3").env
    assert "TORCHINDUCTOR_CACHE_DIR" not in build("cpu", TORCHINDUCTOR_CACHE_DIR="/i").env


@pytest.mark.parametrize("kind", DEVICES)
def test_process_count_up_to_what_was_found(kind):
    most = DEVICES[kind].count
    assert build(kind, NPROC=str(most)).nproc == most
    with pytest.raises(contract.UsageError, match=f"NPROC={most + 1} is more than the {most} .*allowed: 1-{most}"):
        build(kind, NPROC=str(most + 1))


def test_checkpoints_only_when_a_directory_is_given():
    assert "--checkpoint.enable" not in build("cpu").argv and build("cpu").checkpoint_dir is None
    p = build("neuron", CHECKPOINT_DIR="ckpt", CHECKPOINT_INTERVAL="25", CHECKPOINT_KEEP="4", EXTRA_ARGS="--x 1")
    assert p.checkpoint_dir == os.path.abspath("ckpt")
    assert after(p.argv, "--checkpoint.folder") == os.path.abspath("ckpt")  # torchtitan would put a relative
    assert after(p.argv, "--checkpoint.interval") == "25"                  # one under --dump_folder
    assert after(p.argv, "--checkpoint.keep_latest_k") == "4"
    assert "--checkpoint.enable" in p.argv and "--checkpoint.no-last-save-model-only" in p.argv
    assert p.argv[-2:] == ("--x", "1")  # EXTRA_ARGS still last: they can override any of these


def test_max_restarts_and_its_store_per_attempt():
    p = build("cpu", MAX_RESTARTS="2")
    assert p.argv[p.argv.index("--rdzv_endpoint") + 2] == "--max-restarts=2"
    assert p.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    plain = build("cpu")
    assert not [a for a in plain.argv if a.startswith("--max-restarts")]
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plain.env


@pytest.mark.parametrize("variant", VARIANTS)
def test_full_scale_assets_and_the_v5_config_source(variant):
    p = build("neuron", VARIANT=variant, ASSETS_DIR="/a")
    assets = f"/a/{VARIANTS[variant].hf_repo.split('/')[-1]}"
    assert p.assets == after(p.argv, "--hf_assets_path") == assets
    if variant == "v5":  # AutoConfig would otherwise ask the Hub for the repo id
        assert after(p.argv, "--hf_model") == assets
    else:
        assert "--hf_model" not in p.argv
    assert build("neuron", VARIANT=variant, SCALE="smoke").assets is None


def test_each_variant_has_its_own_cache_folders():
    envs = [build("neuron", VARIANT=v, CACHE_DIR="/c").env for v in VARIANTS]
    assert [env["TORCH_NEURONX_NEFF_CACHE_DIR"] for env in envs] == [f"/c/{v}/neff" for v in VARIANTS]
    assert [env["NKI_COMPILE_CACHE_URL"] for env in envs] == [f"/c/{v}/nki" for v in VARIANTS]
