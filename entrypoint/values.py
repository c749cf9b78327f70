"""How each variable's text becomes its value: one parser per kind of value, each naming what it accepts.

A parser raises ValueError outside `parse.allowed` (accepting); the contract (contract.py) turns that into one line
naming the variable, the value and what is allowed. A choice's parser keeps its values in `parse.options`: where its
flag sets a field of the recipes' Config, they are that field's `Literal` (tests/test_settings.py keeps them equal;
the launcher imports no recipes).
"""

import ipaddress
import math
import os
import re
import shlex

from entrypoint.variants import QWEN3_ID

HOST = r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?"
WORD = r"[A-Za-z0-9._-]+"
IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
MODULE_NAME = rf"{IDENTIFIER}(\.{IDENTIFIER})*"
SWITCH = {"0": False, "false": False, "no": False, "off": False, "1": True, "true": True, "yes": True, "on": True}


class UsageError(Exception):
    """Bad input or an impossible request: main prints it as one line on stderr and exits with status 2."""


def accepting(allowed):
    """Give a parser the text that completes "NAME='x' is not ..." in its errors and "accepts" in the docs."""

    def mark(parse):
        parse.allowed = allowed
        return parse

    return mark


def choice(*options):
    @accepting("one of: " + ", ".join(options))
    def parse(raw) -> str:
        if raw not in options:
            raise ValueError
        return raw

    parse.options = options
    return parse


def matching(pattern, allowed):
    @accepting(allowed)
    def parse(raw) -> str:
        if not re.fullmatch(pattern, raw):
            raise ValueError
        return raw

    return parse


def integer(allowed, low=0, high=None, refused=()):
    @accepting(allowed)
    def parse(raw) -> int:
        if not raw.isdigit() or int(raw) < low or (high and int(raw) > high) or int(raw) in refused:
            raise ValueError
        return int(raw)

    return parse


DECIMAL = r"(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?"  # no sign, nan, inf, `_` or hex: what a user means by a number


def decimal(allowed, low, high, from_low=False):
    """A finite number above `low` (from `low` with `from_low`), at most `high` (1e999 is not: it reads as inf)."""

    @accepting(allowed)
    def parse(raw) -> float:
        value = float(raw) if re.fullmatch(DECIMAL, raw) else math.nan
        if not math.isfinite(value) or not (low <= value if from_low else low < value) or not value <= high:
            raise ValueError
        return value

    return parse


def text(allowed):
    return accepting(allowed)(lambda raw: raw)


positive_int, non_negative_int = integer("a positive integer", 1), integer("an integer from 0")
seconds, port = integer("a positive integer (seconds)", 1), integer("a port (1-65535)", 1, 65535)
keep_count = integer("0 or an integer from 2", refused=(1,))  # torchtitan keeps two at least: the newest may be torn
word = matching(WORD, "letters, digits, `.`, `_`, `-`")
module_name = matching(MODULE_NAME, "a Python module name")
qwen3_id = matching(QWEN3_ID, "a Qwen3 Hub id like Qwen/Qwen3-8B (`--list`)")
path = text("a path")
validation = matching(
    r"0?\.[0-9]*[1-9][0-9]*|(?![0-9.]+$)[^-].*", "a local file or folder, or a fraction above 0 and below 1 like 0.05"
)


MIX_PART = re.compile(r"(.+):([0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?|\.[0-9]+([eE][-+]?[0-9]+)?)")


def mix_parts(raw: str) -> list | None:
    """A DATASET mix's (path, weight) pairs, `a.jsonl:0.7,b.parquet:0.3`; None: one source. The recipes read
    the mix itself (neuron_qwen3/data/mix.py); here it is checked for form, and its paths made absolute."""
    if os.path.exists(raw):
        return None
    found = [MIX_PART.fullmatch(piece.strip()) for piece in raw.split(",")]
    if "," not in raw and not found[0]:
        return None
    if not all(found) or not all(float(match[2]) > 0 for match in found):
        raise ValueError
    return [(match[1], match[2]) for match in found]


@accepting(
    "`c4`, a Hub dataset id, a local .jsonl, .json, .parquet or .txt file or folder, or a mix of local ones "
    "with weights above 0 like a.jsonl:0.7,b.parquet:0.3"
)
def dataset(raw) -> str:
    mix_parts(raw)
    return raw


@accepting("shell words")
def shell_words(raw) -> tuple:
    return tuple(shlex.split(raw))


LNC = choice("1", "2")


@accepting(LNC.allowed)
def lnc(raw) -> int:
    return int(LNC(raw))


lnc.options = LNC.options


def span(part):
    """`3` or `0-3` -> (the low end as written, range); `3-1`, `3-`, `-3` and non-digits are refused."""
    low, dash, high = part.partition("-")
    if not low.isdigit() or (dash and not high.isdigit()) or int(low) > int(high or low):
        raise ValueError
    return low, range(int(low), int(high or low) + 1)


@accepting("a core list like 3, 0-3 or 0-3,8 (ascending, no repeats)")
def core_list(raw) -> tuple:
    ids = [core for part in raw.split(",") for core in span(part.strip())[1]]
    if len(set(ids)) != len(ids):
        raise ValueError
    return tuple(ids)


@accepting("one of: " + ", ".join(SWITCH))
def switch(raw) -> bool:
    return SWITCH[raw.strip().lower()]


@accepting("a comma list of GPU indices")
def comma_list(raw) -> tuple:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


@accepting("a host name or IP address")
def host(raw) -> str:
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        matching(HOST, "")(raw)
    return raw


@accepting("`all`, or local ranks like 0 or 0,3")
def local_ranks(raw) -> str:
    """torchrun's `--local-ranks-filter`."""
    ranks = [part.strip() for part in raw.split(",")]
    if raw != "all" and (not all(map(str.isdigit, ranks)) or len(set(ranks)) != len(ranks)):
        raise ValueError
    return raw if raw == "all" else ",".join(ranks)


@accepting("auto or a positive integer")
def procs_per_node(raw) -> int | None:
    """Kubeflow's `auto` (every core found) is None, like unset."""
    return None if raw == "auto" else positive_int(raw)


@accepting("a Slurm node list like trn-[001-003,007]")
def node_list(raw) -> tuple:
    """Slurm's compressed host list: `trn-[001-003,007],head[1-2]` -> ("trn-001", ..., "head2"), padding kept."""
    items = re.findall(r"(?:[^,\[\]]|\[[^\[\]]*\])+", raw)  # commas inside brackets do not split
    if not raw or ",".join(items) != raw:  # an empty item, a stray or nested bracket
        raise ValueError
    return tuple(word(name) for item in items for name in _expand(item))


def _expand(item):
    """One item of a host list, every bracket group expanded (`r[1-2]n[7,9]` -> r1n7, r1n9, r2n7, r2n9)."""
    head, bracket, rest = item.partition("[")
    if not bracket:
        return [item]
    ranges, closed, tail = rest.partition("]")
    if not closed or not ranges:
        raise ValueError
    numbers = []
    for part in ranges.split(","):
        low, numbers_in = span(part)
        numbers.extend(str(n).zfill(len(low)) for n in numbers_in)  # `001-003`: 001, 002, 003
    return [head + number + end for number in numbers for end in _expand(tail)]
