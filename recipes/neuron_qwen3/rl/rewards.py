"""GRPO's reward functions (GRPO_REWARDS, GRPO_REWARD_WEIGHTS), called and checked as TRL 1.16's GRPOTrainer calls
them (`_calculate_rewards`), so a reward function written for TRL runs here unchanged.

- `load` turns the settings into `Rewards`: the built-ins (`BUILT_IN`: accuracy, format, length) and the user's
  `module:function`s, imported with the data's folder first on the path, each with its weight.
- `Rewards.score` calls every function on a batch, `f(prompts=, completions=, completion_ids=, **columns)`, and
  gives the [N, F] rewards (None: NaN, TRL's "no opinion") and each function's seconds.
- `Rewards.total` weighs and sums them as TRL's `sum_then_normalize` does.

Every bad input or bad reward is a `RewardError` of one line that names the function and the record (a function that
raises is called again record by record to find the one), so a run stops at the step that went wrong with a message
that says where to look.
"""

import importlib
import math
import numbers
import os
import sys
import threading
import time

import torch

SETTING = "GRPO_REWARDS"
WEIGHTS = "GRPO_REWARD_WEIGHTS"


class RewardError(ValueError):
    """A reward function that cannot be loaded or gave what GRPO cannot use: one line, naming it and the record."""


def _text(completion) -> str:
    """A completion's text: a string, or TRL's conversational form `[{"role": "assistant", "content": ...}]`."""
    return completion if isinstance(completion, str) else completion[0]["content"]


def accuracy(completions, solution=None, answer=None, **kwargs) -> list[float | None]:
    """TRL's `accuracy_reward`: 1.0 when math-verify finds the completion's answer equal to the gold, else 0.0;
    None (the record not scored) when the gold does not parse. The gold is TRL's `solution` column, else `answer`;
    a number there is read as its text (math-verify parses strings only, and would skip it)."""
    from latex2sympy2_extended import NormalizationConfig  # half a second of sympy: only runs that score answers
    from math_verify import LatexExtractionConfig, parse, verify

    gold = solution if solution is not None else answer
    if gold is None:
        raise ValueError("the records have no `solution` or `answer` column to check against")
    # math-verify times out with signal.alarm, which only the main thread may set: no timeouts elsewhere (TRL's).
    main = threading.current_thread() is threading.main_thread()
    parsing_timeout, verify_timeout = (10, 5) if main else (None, None)
    rewards = []
    for completion, sol in zip(completions, gold, strict=True):
        gold_parsed = parse(sol if isinstance(sol, str) else str(sol), parsing_timeout=parsing_timeout)
        if not gold_parsed:
            rewards.append(None)
            continue
        # The answer must be well-formed LaTeX (no malformed operators), \boxed{} tried first.
        answer_parsed = parse(
            _text(completion),
            extraction_config=[
                LatexExtractionConfig(
                    normalization_config=NormalizationConfig(units=True),
                    boxed_match_priority=0,
                    try_extract_without_anchor=False,
                )
            ],
            extraction_mode="first_match",
            parsing_timeout=parsing_timeout,
        )
        rewards.append(float(verify(gold_parsed, answer_parsed, timeout_seconds=verify_timeout)))
    return rewards


def think_format(completions, **kwargs) -> list[float]:
    """Qwen3's thinking format. With thinking on, the generation prompt ends at `<|im_start|>assistant\\n` and the
    model writes `<think>\\n...\\n</think>\\n\\nanswer`. 1.0 when the completion (decoded text, special tokens such
    as `<|im_end|>` dropped) starts with `<think>`, holds exactly one `<think>` and one `</think>`, and has text other
    than whitespace after `</think>`; else 0.0. The reasoning may be empty. Stricter than TRL's
    `think_format_reward`, which also passes an empty answer and a second `</think>`."""
    rewards = []
    for completion in completions:
        text = _text(completion)
        ok = text.startswith("<think>") and text.count("<think>") == 1 and text.count("</think>") == 1
        rewards.append(1.0 if ok and text.split("</think>", 1)[1].strip() else 0.0)
    return rewards


class _Length:
    """`length`: TRL's `get_soft_overlong_punishment(max_completion_len, soft_punish_cache)` (DAPO's overlong
    penalty) on the completion's token count, with max_completion_len = the run's GRPO_MAX_COMPLETION and the cache a
    quarter of it: 0 up to max - cache tokens, then falling linearly to -1 at max (where the generator cuts a
    completion), -1 above it."""

    def __init__(self, max_completion: int):
        self.max, self.cache = max_completion, max_completion // 4

    def __call__(self, completion_ids, **kwargs) -> list[float]:
        rewards = []
        for ids in completion_ids:
            n = len(ids)
            if n <= self.max - self.cache:
                rewards.append(0.0)
            elif n <= self.max:
                rewards.append((self.max - self.cache - n) / self.cache)
            else:
                rewards.append(-1.0)
        return rewards


BUILT_IN = ("accuracy", "format", "length")


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _import(entry: str, search: tuple[str, ...]):
    """`module:function`, imported with `search` first on sys.path: a rewards.py beside the data imports, and so do
    its own imports of files there; the path is restored after, so the data's folder shadows none of the run's later
    imports."""
    module_name, _, attr = entry.partition(":")
    if not module_name or not attr or ":" in attr:
        raise RewardError(f"{SETTING}: {entry!r} is not module:function")
    saved = list(sys.path)
    sys.path[:0] = [folder for folder in search if folder not in sys.path]
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise RewardError(f"{SETTING}: {entry}: cannot import {module_name} ({_first_line(error)})") from error
    finally:
        sys.path[:] = saved
    func = getattr(module, attr, None)
    if func is None:
        raise RewardError(f"{SETTING}: {entry}: {module_name} ({getattr(module, '__file__', None)}) has no {attr}")
    if not callable(func):
        raise RewardError(f"{SETTING}: {entry}: {module_name}.{attr} is a {type(func).__name__}, not a function")
    return func


def load(names: str, weights: str, max_completion: int, search: tuple[str, ...] = ()) -> "Rewards":
    """The reward functions GRPO_REWARDS names (comma list of built-ins and `module:function`s) and their weights
    (GRPO_REWARD_WEIGHTS: empty, 1 each, else one number per function). `max_completion` sets `length`'s range;
    `search`: folders to import from first (the run passes the data file's folder)."""
    entries = [entry.strip() for entry in names.split(",")]
    allowed = f"built-ins {', '.join(BUILT_IN)}, or module:function"
    if not names.strip():
        raise RewardError(f"{SETTING} is empty: name at least one reward function ({allowed})")
    funcs = []
    for entry in entries:
        if not entry:
            raise RewardError(f"{SETTING}={names!r} has an empty entry: a comma list of {allowed}")
        if entries.count(entry) > 1:
            raise RewardError(f"{SETTING}={names!r} names {entry} twice")
        if ":" in entry:
            funcs.append(_import(entry, search))
        elif entry in BUILT_IN:
            funcs.append({"accuracy": accuracy, "format": think_format, "length": _Length(max_completion)}[entry])
        else:
            raise RewardError(f"{SETTING}: unknown reward {entry!r}; the {allowed}")
    if not weights.strip():
        return Rewards(entries, funcs, [1.0] * len(funcs))
    values = []
    for text in weights.split(","):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise RewardError(f"{WEIGHTS}: {text.strip()!r} is not a finite number")
        values.append(value)
    if len(values) != len(funcs):
        raise RewardError(
            f"{WEIGHTS}={weights!r} gives {len(values)} weights for {len(funcs)} reward functions "
            f"({', '.join(entries)}): one per function, or empty for 1 each"
        )
    return Rewards(entries, funcs, values)


def of_run(config) -> "Rewards":
    """The rewards of a trainer config: GRPO_REWARDS imported with the folders of DATASET's local files first on
    the path; the pre-launch pass and every worker load them alike."""
    from neuron_qwen3.data import mix

    paths = mix.local_paths(config.dataloader.source) or ()
    folders = tuple(dict.fromkeys(p if os.path.isdir(p) else os.path.dirname(os.path.abspath(p)) for p in paths))
    g = config.grpo
    return load(g.rewards, g.reward_weights, g.max_completion, folders)


def _as_list(out) -> list | None:
    """A function's rewards as TRL takes them (any sized sequence torch.tensor reads: a list, a tuple, a 1-D numpy
    array or tensor), as a list; None for anything else (a generator, a dict, a string, a scalar)."""
    if hasattr(out, "tolist") and getattr(out, "ndim", None) == 1:
        return out.tolist()
    return list(out) if isinstance(out, list | tuple) else None


def _as_reward(value) -> float | None:
    """One reward as a float (NaN: TRL's None, "not scored"), or None when TRL's float32 tensor could not hold it
    usefully: not a number (a string, a list) or infinite (it would turn its group's advantages to NaN)."""
    if value is None:
        return math.nan
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy and torch scalars, np.bool_ included
        value = value.item()
    if not isinstance(value, numbers.Real) or math.isinf(value):  # bool is an int: 1.0 and 0.0, as TRL counts it
        return None
    return float(value)


def _batch(origins: list[str]) -> str:
    """The records of a batch, for an error about the batch as a whole."""
    records = list(dict.fromkeys(origins))
    return records[0] if len(records) == 1 else f"its batch of {len(records)} records, {records[0]} to {records[-1]}"


def _raising_record(func, prompts, completions, completion_ids, columns, origins) -> str:
    """The first record on whose completions alone `func` raises too (the batch call raised), else the batch."""
    for record in dict.fromkeys(origins):
        rows = [i for i, origin in enumerate(origins) if origin == record]
        try:
            func(
                prompts=[prompts[i] for i in rows],
                completions=[completions[i] for i in rows],
                completion_ids=[completion_ids[i] for i in rows],
                **{key: [column[i] for i in rows] for key, column in columns.items()},
            )
        except Exception:
            return record
    return _batch(origins)


class Rewards:
    """The run's reward functions, in GRPO_REWARDS's order, and their weights."""

    def __init__(self, names: list[str], funcs: list, weights: list[float]):
        self.names, self.funcs, self.weights = names, funcs, weights

    def score(self, prompts, completions, completion_ids, columns: dict[str, list], origins: list[str]):
        """Every function on the batch as TRL calls it; `columns`: the records' other columns, one value per
        completion; `origins`: each completion's record (file:line), for the errors. Returns the [N, F] float32
        rewards, None (or NaN) as NaN, and {name: seconds} each function took."""
        n = len(completions)
        rewards = torch.full((n, len(self.funcs)), torch.nan, dtype=torch.float32)
        seconds = {}
        for j, (name, func) in enumerate(zip(self.names, self.funcs)):
            start = time.perf_counter()
            try:
                out = func(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
            except Exception as error:
                where = _raising_record(func, prompts, completions, completion_ids, columns, origins)
                raise RewardError(f"{SETTING}: {name} raised {_first_line(error)} on {where}") from error
            seconds[name] = time.perf_counter() - start
            values = _as_list(out)
            if values is None:
                raise RewardError(
                    f"{SETTING}: {name} returned a {type(out).__name__}, not a list of rewards, on {_batch(origins)}"
                )
            if len(values) != n:
                raise RewardError(
                    f"{SETTING}: {name} returned {len(values)} rewards for {n} completions on {_batch(origins)}"
                )
            for i, value in enumerate(values):
                reward = _as_reward(value)
                if reward is None and value is not None:
                    shown = " ".join(repr(value).split())[:80]
                    raise RewardError(
                        f"{SETTING}: {name} gave {shown} on {origins[i]}: a reward is a number, a bool or None "
                        f"(not a string, a list or inf)"
                    )
                rewards[i, j] = math.nan if reward is None else reward
        return rewards, seconds

    def total(self, per_func: torch.Tensor) -> torch.Tensor:
        """Each completion's reward, TRL's sum_then_normalize: the weighted sum over the functions that scored it
        (nansum), NaN where none did (TRL's unscorable rows, left out of the group's baseline)."""
        weights = torch.tensor(self.weights, dtype=per_func.dtype, device=per_func.device)
        summed = (per_func * weights).nansum(dim=1)
        summed[torch.isnan(per_func).all(dim=1)] = torch.nan
        return summed
