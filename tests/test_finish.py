"""One function finishes a config (finish.py): the launcher's `--dry-run` prints exactly the config the workers train.

For each variant with INIT_FROM, LoRA, EPOCHS and VALIDATION set, the pre-launch pass's finished config (the dry
run's `torchtitan_config`) equals the one every worker finished and trained (report/config.json), field for field;
and finishing is a function of the flags, the world and the device alone.

Run: .venv/bin/python -m pytest tests/test_finish.py -q   (three dry runs and three short launches: about a minute)
"""

import functools
import json
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from conftest import REPO, side_by_side_env
from neuron_qwen3.finish import finish
from neuron_qwen3.prelaunch import preflight
from neuron_qwen3.run.same_config import ADDRESS

LAUNCHED_AT = "--report.launched_at"  # the launcher's clock, passed to the workers only (the run report's timing)


def flat(config: dict) -> dict:
    """The config's fields as text, without the addresses of callables (they differ between processes)."""
    return {key: ADDRESS.sub("", json.dumps(value, sort_keys=True)) for key, value in config.items()}


def launcher(tmp, name, *args, **env):
    env = side_by_side_env(SCALE="smoke", OUTPUT_DIR=f"{tmp}/{name}-out", CACHE_DIR=f"{tmp}/cache", **env)
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
    )


@functools.cache
def runs(tmp):
    from test_finetune import corpus_rows, tiny_qwen3
    from test_finetune_variants import save_moe

    tiny_qwen3(f"{tmp}/dense")
    save_moe(f"{tmp}/moe")
    with open(f"{tmp}/data.jsonl", "w") as f:
        f.writelines(json.dumps({"text": row["body"][:300]}) + "\n" for row in corpus_rows(24))
    common = dict(DATASET=f"{tmp}/data.jsonl", EPOCHS="1", VALIDATION="0.25", LORA_RANK="4")

    envs = {
        variant: dict(common, VARIANT=variant, INIT_FROM=f"{tmp}/{base}", NPROC=nproc)
        for variant, base, nproc in (("nki_moe", "moe", "2"), ("native", "dense", "1"), ("v5", "dense", "1"))
    }
    v5_shown = Future()

    def dry(variant):
        return launcher(tmp, variant, "--dry-run", **envs[variant])

    def trained(variant, shown):  # each variant's dry run comes before its training, as a user runs them
        return variant, (shown, launcher(tmp, variant, **envs[variant]), f"{tmp}/{variant}-out/report/config.json")

    def first():
        try:
            v5_shown.set_result(dry("v5"))
        except BaseException as error:  # the other chain waits on it
            v5_shown.set_exception(error)
            raise
        return [trained("nki_moe", dry("nki_moe"))]

    def second():
        return [trained("native", dry("native")), trained("v5", v5_shown.result())]

    # two chains at a time (independent launches, mostly imports on one core; the token cache builds once), the
    # six launches split evenly: a dry run takes about 10 s, a training 30-45 s, nki_moe's on 2 ranks the longest
    with ThreadPoolExecutor(2) as pool:
        return dict(found for chain in pool.map(lambda chain: chain(), (first, second)) for found in chain)


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    return runs(str(tmp_path_factory.mktemp("finish")))


@pytest.mark.training
@pytest.mark.parametrize("variant", ["native", "v5", "nki_moe"])
def test_the_dry_run_shows_the_config_the_workers_train(done, variant):
    dry, run, trained = done[variant]
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    shown = json.loads(dry.stdout)
    assert any(note.startswith("epochs: 1 epochs = ") for note in shown["notes"]), shown["notes"]
    printed, worker = shown["torchtitan_config"], json.loads(open(trained).read())
    assert worker["report"].pop("launched_at") > 0 and printed["report"].pop("launched_at") == 0
    assert flat(printed) == flat(worker)
    # what finishing derived is in both: the validator, the fine-tuning rate, EPOCHS' steps, the tokenizer
    assert worker["lora"]["rank"] == 4 and worker["validator"]["dataloader"]["split"] == "validation"
    assert worker["optimizer"]["param_groups"][0]["optimizer_kwargs"]["lr"] == 2e-5
    assert worker["training"]["steps"] >= 1 and worker["dataloader"]["tokenizer_folder"]


def test_finishing_depends_on_the_flags_the_world_and_the_device_alone(tmp_path):
    """Two parses of the same flags finish to the same config; another world or device finishes to another."""
    from test_finetune import tiny_qwen3

    base = tiny_qwen3(tmp_path / "dense")
    args = [
        "--module",
        "neuron_qwen3",
        "--config",
        "native_qwen3_4b",
        f"--checkpoint.initial_load_path={base}",
        "--checkpoint.initial_load_in_hf",
        "--lora.rank=4",
        "--dataloader.validation=0.1",
    ]

    def finished(world, kind):
        config, problem = preflight.parse_config(args, {})
        assert problem is None, problem
        lines = finish(config, world, kind).lines
        return flat(config.to_dict()), lines

    (one, lines), (again, _) = finished(4, "cpu"), finished(4, "cpu")
    assert one == again and [line.split(" (")[0] for line in lines] == [
        "precision: float32",
        "rope: theta 1,000,000, 4,096 positions, from INIT_FROM's config.json",
        "fine-tuning defaults",
    ]
    (neuron, neuron_lines), (two, _) = finished(4, "neuron"), finished(2, "cpu")
    assert neuron["training"] != one["training"] and [line.split(" (")[0] for line in neuron_lines] == [
        "attention: document-causal, nkilib kernels",
        "rope: theta 1,000,000, 4,096 positions, from INIT_FROM's config.json",
        "fine-tuning defaults",
    ]  # bf16 on Neuron, and attention without Inductor
    assert two["training"] != one["training"]  # the global batch follows the world
