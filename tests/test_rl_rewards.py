"""GRPO's reward functions (rl/rewards.py) against TRL 1.16's own.

- Built-ins: `accuracy` gives trl.rewards.accuracy_reward's values on the same records (strings and TRL's
  conversational completions, `solution` or `answer` as the gold); `length` gives get_soft_overlong_punishment's
  with the cache a quarter of the max; `format` follows a table of Qwen3 completions.
- A user's `module:function` beside the data imports through `search` (and its own sibling import), is called with
  TRL's keywords and the records' columns, and leaves sys.path as it was.
- Scores: None is NaN; the weighted total is TRL's nansum, NaN where every function gave None; each function timed.
- Bad settings and bad rewards: a RewardError of one line naming the function and the record.
Run: .venv/bin/python -m pytest tests/test_rl_rewards.py -q
"""

import math
import sys
import textwrap
import uuid

import pytest
import torch
from trl.rewards import accuracy_reward, get_soft_overlong_punishment

from neuron_qwen3.rl import rewards

GOLD_AND_COMPLETIONS = [
    (r"\frac{1}{3}", r"My answer is \boxed{\frac{1}{3}}"),
    (r"\frac{1}{3}", r"My answer is \boxed{\frac{1}{2}}"),
    ("72", "<think>\n48/2 = 24, 48 + 24 = 72\n</think>\n\nShe sold $\\boxed{72}$ clips."),
    ("72", "<think>\nhmm\n</think>\n\nThe answer is 72."),  # no LaTeX anchor: TRL's parse finds no answer
    ("$5$", r"\boxed{5}"),
    ("no number here", r"\boxed{5}"),  # the gold does not parse: None
    (r"2\sqrt{2}", r"\boxed{\sqrt{8}}"),
    ("10", r"\boxed{10\text{ m}}"),
    ("5", "$5$"),  # LaTeX with no anchor ("answer", \boxed): not an answer to TRL
    ("4", r"\boxed{4}. The final answer is $3$."),  # \boxed is tried first
]
ORIGINS = [f"data/prompts.jsonl:{i + 1}" for i in range(len(GOLD_AND_COMPLETIONS))]


def conversational(text):
    return [{"role": "assistant", "content": text}]


def score_one(name, completions, completion_ids=None, max_completion=16, **columns):
    """The built-in `name`'s column of Rewards.score on one batch."""
    n = len(completions)
    run = rewards.load(name, "", max_completion)
    per_func, _ = run.score(["p"] * n, completions, completion_ids or [[1]] * n, columns, ORIGINS[:n])
    return per_func[:, 0]


def same(ours, theirs):
    """Our [N] tensor (NaN for None) equals TRL's list."""
    return ours.tolist() == pytest.approx([math.nan if r is None else r for r in theirs], nan_ok=True)


@pytest.mark.parametrize("form", ["strings", "conversational"])
@pytest.mark.parametrize("column", ["solution", "answer"])
def test_accuracy_is_trls_accuracy_reward(form, column):
    gold = [g for g, _ in GOLD_AND_COMPLETIONS]
    texts = [c for _, c in GOLD_AND_COMPLETIONS]
    theirs = accuracy_reward([conversational(t) for t in texts], gold)
    assert theirs.count(1.0) >= 3 and theirs.count(0.0) >= 2 and theirs.count(None) == 1  # the table covers all three
    completions = texts if form == "strings" else [conversational(t) for t in texts]
    assert same(score_one("accuracy", completions, **{column: gold}), theirs)


def test_accuracy_prefers_solution_and_reads_a_number_gold_as_text():
    completions = [r"\boxed{3}", r"\boxed{4}"]
    assert score_one("accuracy", completions, solution=["3", "3"], answer=["4", "4"]).tolist() == [1.0, 0.0]
    assert score_one("accuracy", completions, answer=[3, 4]).tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>\nreasoning\n</think>\n\n42", 1.0),  # Qwen3 with thinking on
        ("<think>\n\n</think>\n\n42", 1.0),  # an empty think block, as the template writes with thinking off
        ("<think>a</think>b", 1.0),
        ("<think>\nreasoning\n</think>\n\n", 0.0),  # no answer after the block
        ("<think>\nreasoning\n</think>  \n\t", 0.0),
        ("<think>\nreasoning, never closed. 42", 0.0),
        ("42", 0.0),
        ("\n<think>\nreasoning\n</think>\n\n42", 0.0),  # text before <think>
        ("Sure. <think>\nreasoning\n</think>\n\n42", 0.0),
        ("<think>\na\n</think>\n\n<think>\nb\n</think>\n\n42", 0.0),  # two blocks
        ("<think>\na\n</think>\n\n42</think>", 0.0),  # a second </think>
        ("</think>\n\n42", 0.0),
    ],
)
def test_format_table(text, expected):
    assert score_one("format", [text]).tolist() == [expected]
    assert score_one("format", [conversational(text)]).tolist() == [expected]


@pytest.mark.parametrize("max_completion", [16, 10, 3])
def test_length_is_trls_soft_overlong_punishment_with_a_quarter_cache(max_completion):
    ids = [[7] * n for n in range(max_completion + 3)]
    theirs = get_soft_overlong_punishment(max_completion, max_completion // 4)(ids)
    assert same(score_one("length", ["x"] * len(ids), ids, max_completion), theirs)
    if max_completion == 16:  # 0 to 12 tokens, then -1/4 per token to -1 at 16
        assert theirs[12] == 0.0 and theirs[14] == -0.5 and theirs[16] == -1.0 and theirs[18] == -1.0


@pytest.fixture
def user_module(tmp_path):
    """A user's rewards module and its sibling helper in a data folder, under fresh names; returns (folder, name)."""
    name, helper = f"user_rewards_{uuid.uuid4().hex}", f"user_helper_{uuid.uuid4().hex}"
    (tmp_path / f"{helper}.py").write_text("def words(text):\n    return len(text.split())\n")
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(f"""
        from {helper} import words

        NOT_A_FUNCTION = 3

        def brevity(prompts, completions, completion_ids, target, **kwargs):
            return [1.0 / words(c) if t else None for c, t in zip(completions, target)]

        def echo(prompts, completions, completion_ids, **kwargs):
            return [float(len(p) + len(ids)) for p, ids in zip(prompts, completion_ids)]

        def broken(completions, **kwargs):
            return [1 / 0 for _ in completions]

        def generator(completions, **kwargs):
            return (1.0 for _ in completions)

        def short(completions, **kwargs):
            return [1.0] * (len(completions) - 1)

        def fails_on_the_fifth(completions, **kwargs):
            if "e" in completions:
                raise ValueError("no reward for e")
            return [1.0] * len(completions)

        def fails_in_a_batch(completions, **kwargs):
            if len(completions) > 1:
                raise ValueError("one record at a time")
            return [1.0]

        def gives(completions, value, **kwargs):
            return [0.5] * (len(completions) - 1) + [value[0]]
        """)
    )
    return str(tmp_path), name


def test_user_function_imports_from_search_with_trls_keywords(user_module):
    folder, name = user_module
    path = list(sys.path)
    run = rewards.load(f"{name}:brevity, format,{name}:echo", "", 16, search=(folder,))
    assert sys.path == path, "the data's folder must be off sys.path after the import"
    assert run.names == [f"{name}:brevity", "format", f"{name}:echo"] and run.weights == [1.0, 1.0, 1.0]
    completions = ["<think>\nx\n</think>\n\none two", "<think>\nx\n</think>\n\none", "no think"]
    per_func, seconds = run.score(
        ["ab", "abc", "a"], completions, [[1, 2], [3], [4, 5, 6]], {"target": [True, False, True]}, ORIGINS[:3]
    )
    assert per_func.dtype == torch.float32 and per_func.shape == (3, 3)
    expected = [[1 / 5, 1.0, 4.0], [math.nan, 1.0, 4.0], [1 / 2, 0.0, 4.0]]
    torch.testing.assert_close(per_func, torch.tensor(expected), equal_nan=True)
    assert list(seconds) == run.names and all(s >= 0 for s in seconds.values())


def test_user_function_needs_search(user_module):
    _, name = user_module
    with pytest.raises(rewards.RewardError, match=f"cannot import {name} .ModuleNotFoundError"):
        rewards.load(f"{name}:brevity", "", 16)


def test_weights_and_trls_nansum_total():
    run = rewards.load("accuracy,format,length", "2, 0.5,-1", 16)
    assert run.weights == [2.0, 0.5, -1.0]
    nan = math.nan
    per_func = torch.tensor([[1.0, 1.0, -0.5], [nan, 1.0, 0.0], [nan, nan, nan], [0.0, nan, nan]])
    trl_sum = (per_func * torch.tensor(run.weights)).nansum(dim=1)  # TRL's sum_then_normalize, then its mask
    trl_sum[torch.isnan(per_func).all(dim=1)] = nan
    total = run.total(per_func)
    assert total.tolist() == pytest.approx([3.0, 0.5, nan, 0.0], nan_ok=True)
    assert total.tolist() == pytest.approx(trl_sum.tolist(), nan_ok=True)


def test_none_is_nan_in_scores():
    per_func = score_one("accuracy", [r"\boxed{1}", r"\boxed{1}"], solution=["1", "words only"])
    assert per_func[0].item() == 1.0 and math.isnan(per_func[1].item())


def one_line(error, *parts):
    message = str(error.value)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"
    return message


@pytest.mark.parametrize(
    "names, weights, parts",
    [
        ("", "", ["GRPO_REWARDS is empty", "accuracy, format, length", "module:function"]),
        (" , ", "", ["GRPO_REWARDS", "empty entry"]),
        ("accuracy,,format", "", ["GRPO_REWARDS", "empty entry"]),
        ("accuracy,bogus", "", ["GRPO_REWARDS", "'bogus'", "accuracy, format, length"]),
        ("accuracy,accuracy", "", ["GRPO_REWARDS", "accuracy twice"]),
        ("no_such_module_for_rewards:f", "", ["no_such_module_for_rewards:f", "cannot import", "ModuleNotFoundError"]),
        ("mod:", "", ["'mod:'", "module:function"]),
        ("math:nothing_here", "", ["math:nothing_here", "has no nothing_here"]),
        ("math:pi", "", ["math:pi", "float, not a function"]),
        ("accuracy,format", "1", ["GRPO_REWARD_WEIGHTS", "1 weights for 2", "accuracy, format"]),
        ("accuracy,format", "1,2,3", ["GRPO_REWARD_WEIGHTS", "3 weights for 2"]),
        ("accuracy,format", "1,heavy", ["GRPO_REWARD_WEIGHTS", "'heavy' is not a finite number"]),
        ("accuracy,format", "1,nan", ["GRPO_REWARD_WEIGHTS", "'nan' is not a finite number"]),
        ("accuracy,format", "1,", ["GRPO_REWARD_WEIGHTS", "'' is not a finite number"]),
    ],
)
def test_bad_settings(names, weights, parts):
    with pytest.raises(rewards.RewardError) as error:
        rewards.load(names, weights, 16)
    one_line(error, *parts)


def test_bad_user_attributes(user_module):
    folder, name = user_module
    with pytest.raises(rewards.RewardError) as error:
        rewards.load(f"{name}:missing", "", 16, search=(folder,))
    one_line(error, f"{name}:missing", "has no missing")
    with pytest.raises(rewards.RewardError) as error:
        rewards.load(f"{name}:NOT_A_FUNCTION", "", 16, search=(folder,))
    one_line(error, f"{name}:NOT_A_FUNCTION", "int, not a function")


def test_a_broken_module_is_a_reward_error(tmp_path):
    name = f"user_rewards_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text("def f(:\n")
    with pytest.raises(rewards.RewardError) as error:
        rewards.load(f"{name}:f", "", 16, search=(str(tmp_path),))
    one_line(error, f"{name}:f", "cannot import", "SyntaxError")


@pytest.mark.parametrize(
    "func, value, parts",
    [
        ("broken", None, ["raised ZeroDivisionError: division by zero on data/prompts.jsonl:1"]),
        ("fails_in_a_batch", None, ["raised ValueError: one record at a time on its batch of 3 records, "]),
        ("generator", None, ["returned a generator, not a list of rewards, on its batch of 3 records"]),
        ("short", None, ["returned 2 rewards for 3 completions on its batch of 3 records, data/prompts.jsonl:1 to "]),
        ("gives", "1.0", ["gave '1.0' on data/prompts.jsonl:3", "a number, a bool or None"]),
        ("gives", -math.inf, ["gave -inf on data/prompts.jsonl:3", "or inf"]),
        ("gives", [1.0, 2.0], ["gave [1.0, 2.0] on data/prompts.jsonl:3"]),
    ],
)
def test_bad_rewards(user_module, func, value, parts):
    folder, name = user_module
    run = rewards.load(f"format,{name}:{func}", "", 16, search=(folder,))
    with pytest.raises(rewards.RewardError) as error:
        run.score(["p"] * 3, ["a", "b", "c"], [[1]] * 3, {"value": [value] * 3}, ORIGINS[:3])
    message = one_line(error, f"GRPO_REWARDS: {name}:{func} ", *parts)
    assert message.startswith("GRPO_REWARDS: ")


def test_a_function_that_fails_on_the_fifth_of_eight_records_names_the_fifth(user_module):
    folder, name = user_module
    run = rewards.load(f"{name}:fails_on_the_fifth", "", 16, search=(folder,))
    completions = list("abcdefgh")
    with pytest.raises(rewards.RewardError) as error:
        run.score(["p"] * 8, completions, [[1]] * 8, {}, ORIGINS[:8])
    one_line(
        error, f"GRPO_REWARDS: {name}:fails_on_the_fifth raised ValueError: no reward for e on data/prompts.jsonl:5"
    )


def test_accuracy_without_a_gold_column_names_the_record():
    with pytest.raises(rewards.RewardError) as error:
        score_one("accuracy", [r"\boxed{1}"], target=["1"])
    one_line(error, "GRPO_REWARDS: accuracy raised ValueError", "`solution` or `answer`", "data/prompts.jsonl:1")


def test_what_trl_takes_as_rewards_is_taken_with_its_values(user_module, tmp_path):
    """Numpy and torch scalars, bools (TRL's float32 tensor: 1.0, 0.0), NaN (TRL's None), a 1-D numpy array or
    tensor as the whole answer: each reward the same float TRL's `torch.tensor(..., dtype=torch.float32)` makes."""
    import numpy as np  # torch's dependency: a missing one fails, not skips

    folder, name = user_module
    run = rewards.load(f"{name}:gives", "", 16, search=(folder,))
    values = [np.float32(0.25), 2, np.int64(-1), True, np.bool_(False), torch.tensor(0.75), math.nan, None]
    for value in values:
        per_func, _ = run.score(["p"] * 2, ["a", "b"], [[1]] * 2, {"value": [value] * 2}, ORIGINS[:2])
        trl = torch.tensor([0.5, torch.nan if value is None else value], dtype=torch.float32)
        assert per_func[:, 0].tolist() == pytest.approx(trl.tolist(), nan_ok=True), value
    module = f"user_arrays_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text(
        "import numpy, torch\n"
        "def array(completions, **kwargs):\n    return numpy.array([len(c) for c in completions], dtype=float)\n"
        "def tensor(completions, **kwargs):\n    return torch.tensor([c == 'b' for c in completions])\n"
    )
    run = rewards.load(f"{module}:array,{module}:tensor", "", 16, search=(str(tmp_path),))
    per_func, _ = run.score(["p"] * 3, ["a", "b", "cc"], [[1]] * 3, {}, ORIGINS[:3])
    assert per_func.tolist() == [[1.0, 0.0], [1.0, 1.0], [2.0, 0.0]]
