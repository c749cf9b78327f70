"""From settings and devices to the torchrun command and environment: the article's launch on every platform.

Run: .venv/bin/python -m pytest tests/test_entrypoint_plan.py -q
"""

import os
import sys

import pytest

from entrypoint import contract, plan
from entrypoint.discovery import Devices
from entrypoint.variants import RECIPE_MODULE, SCALES, VARIANTS

DEVICES = {
    "neuron": Devices("neuron", 64, tuple(f"neuron{i}" for i in range(16)), 2),
    "cuda": Devices("cuda", 8, tuple(f"nvidia{i}" for i in range(8))),
    "cpu": Devices("cpu", os.cpu_count()),
}
ARTICLE = [
    "--rdzv_backend",
    "c10d",
    "--rdzv_endpoint",
    "127.0.0.1:0",
    "--local-addr",
    "127.0.0.1",
    f"--shutdown-timeout={contract.parse({}).stop_grace}",
    f"--log-dir={os.path.abspath('outputs/torchrun')}",
    "--local-ranks-filter",
    "0",
    "--role",
    "rank",
    "--tee",
    "3",
]


def build(kind, environ=None, **env):
    """The plan; on CPU with SCALE=full said explicitly, as the full scale is refused there by default."""
    environ = {**({"SCALE": "full"} if kind == "cpu" else {}), **(environ or {}), **env}
    return plan.build(contract.parse(environ), DEVICES[kind], environ)


def after(argv, flag):
    """The value of `flag`, given as `flag value` or `flag=value`."""
    if flag in argv:
        return argv[argv.index(flag) + 1]
    return next(word.split("=", 1)[1] for word in argv if word.startswith(flag + "="))


@pytest.mark.parametrize("kind", DEVICES)
@pytest.mark.parametrize("variant", VARIANTS.values(), ids=list(VARIANTS))
@pytest.mark.parametrize("scale", SCALES)
def test_article_launch_for_every_platform_variant_and_scale(kind, variant, scale):
    p = build(kind, VARIANT=variant.name, SCALE=scale)
    nproc = 1 if kind == "cpu" else DEVICES[kind].count
    config = variant.configs["bench_cpu" if (kind, scale) == ("cpu", "bench") else scale]
    n = 6 + len(ARTICLE)
    assert list(p.argv[:n]) == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        *ARTICLE,
        "-m",
        "torchtitan.train",
    ]  # the article's worker on every device
    assert p.argv[n : n + 5] == ("--module", RECIPE_MODULE, "--config", config, f"--device={kind}")
    assert p.worker_args == p.argv[n:]
    assert (p.variant, p.scale, p.module, p.config, p.nproc) == (variant.name, scale, RECIPE_MODULE, config, nproc)
    assert after(p.argv, "--dump_folder") == os.path.abspath("outputs")
    if scale == "full":
        assert after(p.argv, "--hf_assets_path") == os.path.abspath(f"assets/hf/{variant.hf_repo.split('/')[-1]}")
    else:
        assert not [word for word in p.argv if word.startswith("--hf_assets_path")]
        assert p.env["HF_HUB_OFFLINE"] == p.env["HF_DATASETS_OFFLINE"] == "1"
    assert "--compile.enable" not in p.argv and "--training.steps" not in p.argv


@pytest.mark.parametrize("kind, backend", [("neuron", "neuron"), ("cuda", "inductor"), ("cpu", "inductor")])
def test_compile_backend_per_platform(kind, backend):
    argv = build(kind, COMPILE="on").argv
    assert argv[argv.index("--compile.enable") + 1] == f"--compile.backend={backend}"


def test_steps_paths_and_extra_args_last():
    argv = build("cuda", STEPS="7", ASSETS_DIR="/a", OUTPUT_DIR="/o", EXTRA_ARGS="--x.y 1 --z 'a b'").argv
    assert after(argv, "--training.steps") == "7"
    assert after(argv, "--hf_assets_path") == "/a/Qwen3-4B"
    assert after(argv, "--dump_folder") == "/o"
    assert argv[-4:] == ("--x.y", "1", "--z", "a b")


def test_environment_on_each_platform():
    """Only what the workers' runtimes read: every setting of the run itself is a flag."""
    cache = os.path.abspath("./cache/native")  # one folder per variant
    neuron = build("neuron", NEURON_RT_VISIBLE_CORES="0-63").env
    assert neuron == {
        "PYTHONUNBUFFERED": "1",
        "PYTHONFAULTHANDLER": "1",
        "NEURON_LOGICAL_NC_CONFIG": "2",
        "NEURON_RT_VISIBLE_CORES": "0-63",
        "TORCH_NEURONX_NEFF_CACHE_DIR": f"{cache}/neff",
        "TORCH_NEURONX_HLO_CACHE_DIR": f"{cache}/hlo",
        "NKI_COMPILE_CACHE_URL": f"{cache}/nki",
    }
    assert build("cuda", CACHE_DIR="/c", VARIANT="v5", SCALE="smoke").env == {
        "PYTHONUNBUFFERED": "1",
        "PYTHONFAULTHANDLER": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TORCHINDUCTOR_CACHE_DIR": "/c/v5/inductor",
    }
    assert build("cpu", NPROC="1").env["OMP_NUM_THREADS"] == str(os.cpu_count())


def test_variables_already_set_are_kept():
    env = build("neuron", TORCH_NEURONX_NEFF_CACHE_DIR="/n", NKI_COMPILE_CACHE_URL="/k").env
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
    assert after(p.argv, "--checkpoint.interval") == "25"  # one under --dump_folder
    assert after(p.argv, "--checkpoint.keep_latest_k") == "4"
    assert "--checkpoint.enable" in p.argv and "--checkpoint.no-last-save-model-only" in p.argv
    assert p.argv[-2:] == ("--x", "1")  # EXTRA_ARGS still last


def test_paths_that_look_like_flags_stay_values():
    """torchtitan would read `--dump_folder -o` as two flags; `--dump_folder=/abs/-o` is one value."""
    argv = build("neuron", OUTPUT_DIR="-o", CHECKPOINT_DIR="-c", ASSETS_DIR="-a").argv
    assert f"--dump_folder={os.path.abspath('-o')}" in argv and f"--checkpoint.folder={os.path.abspath('-c')}" in argv
    assert f"--hf_assets_path={os.path.abspath('-a')}/Qwen3-4B" in argv
    assert f"--log-dir={os.path.abspath('-o')}/torchrun" in argv  # every rank's log, kept with the outputs


def test_max_restarts_and_its_store_per_attempt():
    p = build("cpu", MAX_RESTARTS="2")
    assert p.argv[p.argv.index("--rdzv_endpoint") + 4] == "--max-restarts=2"
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


def test_every_variable_set_reaches_the_workers_as_its_flag(tmp_path):
    """The contract's flag column is what the plan does: each variable's flag(s) in the workers' arguments."""
    data = tmp_path / "d.jsonl"
    data.write_text("{}")
    environ = {
        "STEPS": "3",
        "COMPILE": "1",
        "MODEL": "Qwen/Qwen3-8B",
        "INIT_FROM": "/w",
        "EXPORT_DIR": "e",
        "EXPORT_DTYPE": "float32",
        "EXPORT_MAX_SHARD_MB": "500",
        "DATASET": str(data),
        "DATASET_FIELD": "t",
        "WANDB_MODE": "offline",
        "WANDB_API_KEY": "k",
        "ASSETS_DIR": "/a",
        "OUTPUT_DIR": "/o",
        "CHECKPOINT_DIR": "/c",
        "NEURON_LOGICAL_NC_CONFIG": "1",
        "NEURON_QWEN3_MOE_KERNEL": "reference",
        "CHECKPOINT_INTERVAL": "5",
        "CHECKPOINT_KEEP": "2",
        "DEVICE": "neuron",
        "LR": "2e-5",
        "WARMUP_STEPS": "0.03",
        "LR_SCHEDULE": "cosine",
        "BATCH_SIZE": "64",
        "SEQ_LEN": "1024",
        "SEED": "7",
        "NAN_POLICY": "warn",
    }
    args = build("neuron", environ).worker_args
    for var in contract.VARS:
        if var.name in environ and var.flag.startswith("--"):
            for flag in (word for word in var.flag.split() if word.startswith("--")):
                assert any(arg == flag or arg.startswith(flag + "=") for arg in args), (var.name, flag, args)
    assert after(args, "--config") == "native_qwen3_8b" and after(args, "--report.model") == "Qwen/Qwen3-8B"
    assert after(args, "--export.dir") == os.path.abspath("e") and after(args, "--dataloader.source") == str(data)
    assert after(args, "--neuron.logical_nc_config") == "1" and after(args, "--training.steps") == "3"
    assert [
        after(args, flag)
        for flag in (
            "--tune.lr",
            "--tune.warmup",
            "--lr_scheduler.decay_type",
            "--training.global_batch_size",
            "--training.seq_len",
            "--debug.seed",
            "--divergence.policy",
        )
    ] == ["2e-05", "0.03", "cosine", "64", "1024", "7", "warn"]
    assert after(args, "--export.max_shard_mb") == "500"


def test_defaults_are_the_configs_own_and_a_hub_dataset_stays_an_id():
    args = build("cpu", SCALE="smoke").worker_args
    assert not [
        arg
        for arg in args
        if arg.startswith(
            (
                "--training.steps",
                "--export",
                "--dataloader",
                "--neuron",
                "--tune",
                "--lr_scheduler",
                "--training.global_batch_size",
                "--training.seq_len",
                "--debug",
                "--divergence",
            )
        )
    ]
    assert after(build("cpu", DATASET="allenai/c4").worker_args, "--dataloader.source") == "allenai/c4"


@pytest.mark.parametrize("flag", ["--device=cpu", "--neuron.logical-nc-config", "--dump_folder=/x", "--config=x"])
def test_flags_the_launcher_owns_are_refused(flag):
    with pytest.raises(contract.UsageError, match="which the launcher owns"):
        build("cpu", EXTRA_ARGS=flag)
