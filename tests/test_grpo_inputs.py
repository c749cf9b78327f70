"""METHOD=grpo's bad input through the launcher, as a user meets it: one line that names the bad value (and what is
allowed), before anything trains.

- the contract (entrypoint/contract.py): GRPO_LOSS, GRPO_TOP_P out of their ranges, GRPO_REWARDS set but empty:
  one line, exit 2 at once;
- the recipes' pre-launch pass (prelaunch/preflight.py, in a child with torch): prompt-only records under SFT (as
  DATASET or VALIDATION), chat records under grpo (as either), EPOCHS under grpo, no GRPO_REWARDS, GRPO_GENERATIONS
  that does not divide a rank's completions, a reward that is no built-in, a `module:function` whose module or
  function is missing, a prompt (of DATASET or VALIDATION, on its second line) too long for the window beside
  GRPO_MAX_COMPLETION: one line, exit 2, torchrun never started;
- the worker at step 1 (the pre-launch pass imports the rewards but cannot call them): a reward that raises, or
  returns one reward for two completions, is one line naming the function and the record (`file:line`), the worker
  exits 2 and torchrun's failure table repeats the line; the launcher's status is torchrun's, 1 (docs/production.md,
  "Exit statuses": a worker's failure is 1 whatever the worker's own status).

Every run is smoke scale, VARIANT=native, random init, offline and without sample prompts, on TRL's prompt-only
form ({"prompt": [{"role": "user", ...}], "answer": ...}) written under tmp_path, one record so its line is known.
Run: .venv/bin/python -m pytest tests/test_grpo_inputs.py -q
"""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ANSI, RECIPES, STEP_LOSS, launcher_errors

RECORD = {"prompt": [{"role": "user", "content": "Is 4 even?"}], "answer": "Yes."}
CHAT = {"messages": [{"role": "user", "content": "Is 4 even?"}, {"role": "assistant", "content": "Yes."}]}
MODULE = "grpo_input_rewards"  # written beside the data: GRPO_REWARDS imports it with the data's folder first
REWARDS = """
def fails(completions, **kwargs):
    return 1 / 0


def one_short(completions, **kwargs):
    return [1.0] * (len(completions) - 1)
"""
# Offline, no sample prompts: launcher_errors passes only the variables given (PATH, PYTHONPATH, the smoke scale).
QUIET = {"VARIANT": "native", "HF_HUB_OFFLINE": "1", "SAMPLE_PROMPTS": ""}
# Sizes that fit the smoke window (seq_len 256) and batch (2): one prompt x 2 completions of up to 8 tokens a step.
GRPO = {
    **QUIET,
    "METHOD": "grpo",
    "GRPO_REWARDS": "length",
    "GRPO_MAX_COMPLETION": "8",
    "GRPO_GENERATIONS": "2",
    "BATCH_SIZE": "2",
    "STEPS": "1",
}
WORKER_FAILED = 1  # the launcher's status when a worker failed: torchrun's (docs/production.md, "Exit statuses")


def written(tmp_path) -> dict:
    """The files a case names: {data} the prompt-only record, {chat} a conversation, {rewards} the module beside
    {data}, all in tmp_path."""
    (tmp_path / "data.jsonl").write_text(json.dumps(RECORD) + "\n")
    (tmp_path / "chat.jsonl").write_text(json.dumps(CHAT) + "\n")
    (tmp_path / f"{MODULE}.py").write_text(REWARDS)
    long = {**RECORD, "prompt": [{"role": "user", "content": "Is 4 even? " * 200}]}  # 248 tokens fit, not these
    (tmp_path / "long.jsonl").write_text(json.dumps(RECORD) + "\n" + json.dumps(long) + "\n")
    return {
        "data": tmp_path / "data.jsonl",
        "chat": tmp_path / "chat.jsonl",
        "rewards": tmp_path / f"{MODULE}.py",
        "long": tmp_path / "long.jsonl",
    }


def filled(values: dict, files: dict) -> dict:
    return {key: value.format(**files) for key, value in values.items()}


# (id, the environment, what the one line holds); {data}, {chat}, {rewards}: written()'s paths.
BEFORE_LAUNCH = [
    (
        "prompts-under-sft",
        {**QUIET, "DATASET": "{data}"},
        ["DATASET: {data} holds prompt-only records", "train them with METHOD=grpo"],
    ),
    (
        "chat-under-grpo",
        {**GRPO, "DATASET": "{chat}", "DATASET_FIELD": "messages"},
        ["DATASET: {chat} holds chat records", "METHOD=grpo trains on prompt-only records (a `prompt` field)"],
    ),
    (
        "chat-validation-under-grpo",
        {**GRPO, "DATASET": "{data}", "VALIDATION": "{chat}", "DATASET_FIELD": "messages"},
        ["VALIDATION: {chat} holds chat records", "METHOD=grpo trains on prompt-only records (a `prompt` field)"],
    ),
    (
        "prompt-validation-under-sft",
        {**QUIET, "DATASET": "{chat}", "DATASET_FIELD": "messages", "VALIDATION": "{data}"},
        ["VALIDATION: {data} holds prompt-only records", "train them with METHOD=grpo"],
    ),
    (
        "epochs-under-grpo",
        {**{k: v for k, v in GRPO.items() if k != "STEPS"}, "DATASET": "{data}", "EPOCHS": "2"},
        ["EPOCHS=2 under METHOD=grpo", "counted in steps (STEPS)"],
    ),
    (
        "no-rewards",
        {**{k: v for k, v in GRPO.items() if k != "GRPO_REWARDS"}, "DATASET": "{data}"},
        ["METHOD=grpo needs GRPO_REWARDS", "accuracy, format, length or module:function"],
    ),
    (
        "generations-do-not-divide",
        {**GRPO, "GRPO_GENERATIONS": "3", "BATCH_SIZE": "8", "DATASET": "{data}"},
        [
            "BATCH_SIZE=8 gives each rank 8 completions a step",
            "not a multiple of GRPO_GENERATIONS=3",
            "a multiple of 6",
        ],
    ),
    (
        "unknown-built-in",
        {**GRPO, "GRPO_REWARDS": "length,accurasy", "DATASET": "{data}"},
        ["GRPO_REWARDS: unknown reward 'accurasy'", "built-ins accuracy, format, length, or module:function"],
    ),
    (
        "no-such-module",
        {**GRPO, "GRPO_REWARDS": "no_such_reward_module:score", "DATASET": "{data}"},
        [
            "GRPO_REWARDS: no_such_reward_module:score: cannot import no_such_reward_module",
            "No module named 'no_such_reward_module'",
        ],
    ),
    (
        "too-long-a-prompt",
        {**GRPO, "DATASET": "{long}"},
        ["DATASET: {long}:2: ", " prompt tokens; the window leaves 248 beside GRPO_MAX_COMPLETION=8: shorten the"],
    ),
    (
        "too-long-a-validation-prompt",
        {**GRPO, "DATASET": "{data}", "VALIDATION": "{long}"},
        ["VALIDATION: {long}:2: ", " prompt tokens; the window leaves 248 beside GRPO_MAX_COMPLETION=8"],
    ),
    (
        "no-such-function",
        {**GRPO, "GRPO_REWARDS": f"{MODULE}:missing", "DATASET": "{data}"},
        [f"GRPO_REWARDS: {MODULE}:missing: {MODULE} ({{rewards}}) has no missing"],
    ),
]


# The two reward functions that fail in the worker, at step 1: (id, the function, what its one line says).
AT_STEP_1 = [
    ("raises", "fails", "raised ZeroDivisionError: division by zero on {data}:1"),
    ("wrong-length", "one_short", "returned 1 rewards for 2 completions on {data}:1"),
]


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict:
    """Every launch of BEFORE_LAUNCH and AT_STEP_1, two at a time (a refusal is mostly the pre-launch pass's
    imports, on one core): {id: (its folder, written()'s files, the exit status, the stderr lines)}."""
    jobs = [  # the longest first
        *(
            (name, {**GRPO, "GRPO_REWARDS": f"{MODULE}:{function}", "DATASET": "{data}"}, 300)
            for name, function, _ in AT_STEP_1
        ),
        *((name, env, 120) for name, env, _ in BEFORE_LAUNCH),
    ]

    # The folders are made here, not in the threads: pytest's first mktemp of a session makes its base folder, and
    # two threads doing that at once each make one (a file run alone failed on it).
    folders = {name: tmp_path_factory.mktemp(name) for name, _, _ in jobs}

    def launch(name, env, timeout):
        files = written(folders[name])
        return name, (folders[name], files, *launcher_errors(folders[name], timeout=timeout, **filled(env, files)))

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(lambda job: launch(*job), jobs))


@pytest.mark.parametrize(
    "name, says", [(case[0], case[2]) for case in BEFORE_LAUNCH], ids=[c[0] for c in BEFORE_LAUNCH]
)
def test_the_pre_launch_pass_refuses_in_one_line(launched, name, says):
    tmp_path, files, status, lines = launched[name]
    assert status == 2 and len(lines) == 1 and lines[0].startswith("entrypoint: "), lines
    for part in says:
        assert part.format(**files) in lines[0], lines[0]
    assert not (tmp_path / "out" / "torchrun").exists()  # torchrun never started


@pytest.mark.parametrize(
    "variable, value, says",
    [
        ("GRPO_LOSS", "ppo", "GRPO_LOSS='ppo' is not one of: dapo, grpo, dr_grpo, bnpo"),
        ("GRPO_TOP_P", "0", "GRPO_TOP_P='0' is not a number above 0, at most 1"),
        ("GRPO_REWARDS", "", "GRPO_REWARDS='' is not a comma list of accuracy, format, length or module:function"),
    ],
    ids=["GRPO_LOSS", "GRPO_TOP_P", "GRPO_REWARDS-empty"],
)
def test_the_contract_refuses_a_value_out_of_range(tmp_path, variable, value, says):
    files = written(tmp_path)
    status, lines = launcher_errors(
        tmp_path, timeout=60, **filled({**GRPO, "DATASET": "{data}", variable: value}, files)
    )
    assert status == 2 and lines == [f"entrypoint: {says}"], lines
    assert not (tmp_path / "out" / "torchrun").exists()


@pytest.mark.training  # torchrun and a worker that builds the model and generates: ~20 s
@pytest.mark.parametrize("name, function, says", AT_STEP_1, ids=[case[0] for case in AT_STEP_1])
def test_a_reward_that_fails_at_step_1_stops_the_worker_in_one_line(launched, name, function, says):
    tmp_path, files, status, lines = launched[name]
    lines = [ANSI.sub("", line) for line in lines]
    output = "\n".join(lines)
    line = f"neuron_qwen3: GRPO_REWARDS: {MODULE}:{function} {says.format(**files)}"
    assert status == WORKER_FAILED, output
    assert [text for text in lines if "neuron_qwen3: " in text and text.startswith("[rank0]:")] == [
        f"[rank0]:{line}"
    ], output  # the worker's one line, once
    assert "exitcode  : 2" in output and f"traceback : {line}" in output, output  # torchrun's failure table
    logged = [ANSI.sub("", log.read_text()) for log in (tmp_path / "out" / "torchrun").rglob("stdout.log")]
    assert logged and not any(STEP_LOSS.search(log) for log in logged), logged  # the worker ran; no step trained
    assert f'File "{RECIPES}' not in output, output  # no traceback of the recipes
