"""The fine-tuning knobs (tuning.py): LR and WARMUP_STEPS on torchtitan's fields, fine-tuning defaults only where
nothing was given, the global batch checked against the ranks before launch, and stock torchtitan.train doing the
same as the launcher.

Run: .venv/bin/python -m pytest tests/test_tuning.py -q   (the stock run: about 20 s on CPU)
"""

import json
import re
import subprocess
import sys

import pytest

from conftest import worker_env
from neuron_qwen3.prelaunch import preflight
from neuron_qwen3.run import tuning
from neuron_qwen3.settings import Tune

SMOKE = ["--module", "neuron_qwen3", "--config", "native_qwen3_smoke"]
LOAD = "--checkpoint.initial_load_path=/model"


def config(*flags):
    parsed, problem = preflight.parse_config([*SMOKE, *flags], {})
    assert problem is None, problem
    return parsed


def lr_and_warmup(parsed):
    return [group.optimizer_kwargs["lr"] for group in parsed.optimizer.param_groups], parsed.lr_scheduler.warmup_steps


def test_without_an_initial_load_the_configs_values_stay_and_the_knobs_set_them():
    parsed = config()
    assert tuning.apply(parsed) == [] and lr_and_warmup(parsed) == ([8e-4], 2)
    parsed = config("--tune.lr=1e-4", "--tune.warmup=0.3")  # a fraction of the 10 steps
    assert tuning.apply(parsed) == [] and lr_and_warmup(parsed) == ([1e-4], 3)
    parsed = config("--tune.warmup=4")
    assert tuning.apply(parsed) == [] and lr_and_warmup(parsed) == ([8e-4], 4)


def test_a_fine_tune_gets_the_defaults_in_one_line():
    parsed = config(LOAD)
    assert tuning.apply(parsed) == [
        "fine-tuning defaults (checkpoint.initial_load_path is set): lr 2e-05 in place of 0.0008; warm-up 1 of 10 "
        "steps in place of 2 (LR, WARMUP_STEPS or --tune.lr, --tune.warmup choose others)"
    ]
    assert lr_and_warmup(parsed) == ([tuning.FINETUNE_LR], 1)  # 8 % of 10 steps, at least one


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--tune.lr=1e-5", "--tune.warmup=0"], ([1e-5], 0)),
        (["--tune.lr=3e-5"], ([3e-5], 1)),  # the warm-up still the fine-tuning default
        (["--tune.warmup=5"], ([tuning.FINETUNE_LR], 5)),
    ],
)
def test_a_fine_tune_keeps_what_the_project_fields_give(flags, expected):
    parsed = config(LOAD, *flags)
    tuning.apply(parsed)
    assert lr_and_warmup(parsed) == expected


def typed(*flags):
    parsed = config(LOAD, *flags)
    return parsed, tuning.apply(parsed, tuning.typed_flags(flags))


@pytest.mark.parametrize(
    "lr_flag",
    [["--optimizer.param-groups.0.optimizer-kwargs.lr", "0"], ["--optimizer.param_groups.0.optimizer_kwargs.lr=0"]],
)
def test_under_a_fine_tune_a_typed_torchtitan_flag_wins_and_the_line_says_so(lr_flag):
    """A value given through torchtitan's own flag is the user's choice: the fine-tuning default stays off it."""
    parsed, (line,) = typed(*lr_flag, "--lr_scheduler.warmup_steps=5")
    assert lr_and_warmup(parsed) == ([0.0], 5)
    assert line == (
        "fine-tuning defaults (checkpoint.initial_load_path is set): none applied; not applied, a torchtitan flag "
        "typed wins: lr 0 as typed (--optimizer.param_groups.0.optimizer_kwargs.lr); warm-up 5 steps as typed "
        "(--lr_scheduler.warmup_steps) (LR, WARMUP_STEPS or --tune.lr, --tune.warmup choose others)"
    )
    parsed, (line,) = typed(*lr_flag)  # the warm-up not typed: its default applies
    assert lr_and_warmup(parsed) == ([0.0], 1)
    assert "warm-up 1 of 10 steps in place of 2; not applied, a torchtitan flag typed wins: lr 0 as typed" in line


def test_the_projects_fields_win_over_a_typed_torchtitan_flag():
    """LR sets every group, as documented; a typed group's value is then not the run's."""
    parsed, lines = typed("--optimizer.param-groups.0.optimizer-kwargs.lr=3e-5", "--tune.lr=1e-5")
    assert lr_and_warmup(parsed) == ([1e-5], 1) and lines[0].endswith(
        "warm-up 1 of 10 steps in place of 2 (LR, WARMUP_STEPS or --tune.lr, --tune.warmup choose others)"
    )


def test_every_param_group_gets_lr():
    parsed = config()
    group = parsed.optimizer.param_groups[0]
    parsed.optimizer.param_groups = [
        type(group)(pattern="norm", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-3}),
        group,
    ]
    parsed.tune = Tune(lr=5e-5)
    tuning.apply(parsed)
    assert lr_and_warmup(parsed)[0] == [5e-5, 5e-5]


@pytest.mark.parametrize("flag", ["--tune.lr=-1e-5", "--tune.lr=2", "--tune.warmup=2.5", "--tune.warmup=-1"])
def test_a_bad_value_from_a_stock_command_line_is_one_line(flag):
    """The tune section refuses it as the flags parse (settings.Tune), before the knobs are applied."""
    parsed, problem = preflight.parse_config([*SMOKE, flag], {})
    assert parsed is None and re.fullmatch(
        rf"{flag.split('=')[0]}=\S+ is (not a learning rate from 0 to 1|"
        r"neither a whole number of steps nor a fraction below 1)",
        problem,
    ), problem


def test_the_global_batch_divides_by_local_batch_and_data_parallel_ranks():
    assert tuning.batch(config(), 2) == (4, 4)  # torchtitan's -1: one micro-step of local 2 on 2 ranks
    assert tuning.batch(config("--training.global_batch_size=8"), 2) == (8, 4)  # accumulation 2
    assert tuning.batch_problem(config("--training.global_batch_size=8"), 2) is None
    assert tuning.batch_problem(config("--training.global_batch_size=6"), 2) == (
        "BATCH_SIZE=6 (--training.global_batch_size) is not a multiple of local batch 2 x 2 data-parallel ranks = 4: "
        "use 4, 8, 12, ... (gradient accumulation = BATCH_SIZE / 4)"
    )
    assert tuning.batch_problem(config("--training.global_batch_size=2"), 2).startswith("BATCH_SIZE=2 ")  # below one
    misfit = tuning.batch_problem(config("--parallelism.tensor_parallel_degree=3"), 2)
    assert misfit == "parallelism on 2 ranks: the parallel degrees do not divide the ranks"  # torchtitan: no text
    misfit = tuning.batch_problem(config("--parallelism.tensor_parallel_degree=2"), 3)
    assert misfit.startswith("parallelism on 3 ranks: Invalid parallel dims: ") and "\n" not in misfit


def test_the_pre_launch_pass_prints_what_will_train_and_stops_on_a_bad_batch():
    answer = preflight.run(
        {"args": [*SMOKE, LOAD, "--lr_scheduler.decay_type=cosine"], "ranks": 2, "print_config": True}
    )
    shown = answer["config"]
    assert answer["problems"] == [] and answer["lines"][0].startswith("fine-tuning defaults")
    assert shown["optimizer"]["param_groups"][0]["optimizer_kwargs"]["lr"] == tuning.FINETUNE_LR
    assert (shown["lr_scheduler"]["warmup_steps"], shown["lr_scheduler"]["decay_type"]) == (1, "cosine")
    assert (shown["training"]["global_batch_size"], shown["training"]["local_batch_size"]) == (4, 2)
    bad = preflight.run({"args": [*SMOKE, "--training.global_batch_size=3"], "ranks": 1, "print_config": True})
    assert bad["problems"] == [
        "BATCH_SIZE=3 (--training.global_batch_size) is not a multiple of local batch 2 x 1 "
        "data-parallel ranks = 2: use 2, 4, 6, ... (gradient accumulation = BATCH_SIZE / 2)"
    ]
    assert bad["config"] is None


@pytest.mark.training
def test_stock_torchtitan_train_applies_the_fine_tuning_defaults_and_accumulates(tmp_path):
    """The article's command, no launcher: the trainer itself applies the rule the pre-launch pass showed."""
    from test_finetune import tiny_qwen3

    source = tiny_qwen3(tmp_path / "source")
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=1",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "localhost:0",
        "-m",
        "torchtitan.train",
        *SMOKE,
        "--training.steps=3",
        "--checkpoint.enable",
        f"--checkpoint.initial_load_path={source}",
        "--checkpoint.initial_load_in_hf",
        "--checkpoint.initial_load_model_only",
        "--checkpoint.load_only",
        "--training.global_batch_size=4",
        f"--dump_folder={tmp_path / 'out'}",
    ]
    result = subprocess.run(argv, env=worker_env(), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "fine-tuning defaults (checkpoint.initial_load_path is set): lr 2e-05" in output
    assert "global batch size 4, gradient accumulation steps 2" in output
    records = [json.loads(line) for line in (tmp_path / "out" / "report" / "metrics.jsonl").read_text().splitlines()]
    assert [record["lr"] for record in records][0] == pytest.approx(tuning.FINETUNE_LR)  # warm-up 1: the peak


@pytest.mark.training
def test_a_typed_learning_rate_of_0_with_init_from_trains_at_0(tmp_path):
    """Through the launcher, torchtitan's own flag on its command line: every step at lr 0, and the export is the
    INIT_FROM folder tensor for tensor."""
    from conftest import REPO, folder_tensors
    from test_finetune import tiny_qwen3

    source = tiny_qwen3(tmp_path / "source")
    env = worker_env(
        VARIANT="native",
        SCALE="smoke",
        INIT_FROM=str(source),
        STEPS="2",
        OUTPUT_DIR=str(tmp_path / "out"),
        CACHE_DIR=str(tmp_path / "cache"),
        EXPORT_DIR=str(tmp_path / "export"),
        EXPORT_DTYPE="float32",
    )
    result = subprocess.run(
        [sys.executable, "-m", "entrypoint", "--optimizer.param-groups.0.optimizer-kwargs.lr", "0"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "lr 0 as typed (--optimizer.param_groups.0.optimizer_kwargs.lr)" in output
    records = [json.loads(line) for line in (tmp_path / "out" / "report" / "metrics.jsonl").read_text().splitlines()]
    assert [record["lr"] for record in records if "lr" in record] == [0.0, 0.0]
    before, after = folder_tensors(source), folder_tensors(tmp_path / "export")
    assert sorted(before) == sorted(after) and all(torch_equal(before[k], after[k]) for k in before)


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)
