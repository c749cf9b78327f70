"""Each setting is defined once: the project's Config sections (settings.py) check their own values, and the
launcher's list of each choice is its Config field's `Literal`.

- for every variable of the launcher's contract whose parser is a choice, the choices equal the `Literal` of the
  Config field its flag sets (read from the contract's table, resolved on a config function's Config);
- a bad value of a section is one line naming the flag: refused when the section is built, by tyro's parse in the
  worker (exit 2) and in the pre-launch pass (that line alone), and by the launcher (exit 2);
- the code that acts on a choice reads it from the `Literal` (DPO's losses);
- the launcher's help states each default as its Config field starts (`default: 512`; a value in words is listed),
  and a number the launcher takes the section takes, one it refuses the section refuses (probed at 0, 1, 0.5, ...;
  but the section's unset default and a number form the launcher's pattern does not read).
Run: .venv/bin/python -m pytest tests/test_settings.py -q
"""

import dataclasses
import re

import pytest

from conftest import launcher_errors, recipes_pass
from entrypoint import contract, values
from neuron_qwen3 import config_registry, settings
from neuron_qwen3.prelaunch import preflight

SMOKE = ["--module", "neuron_qwen3", "--config", "native_qwen3_smoke"]
FLAG = re.compile(r"--([A-Za-z_][\w.]*)")
CONFIG_MANAGER_FLAGS = ("module", "config")  # torchtitan's ConfigManager takes them, not the Config


def field_of(config, flag: str):
    """(the dataclass that holds `--a.b.c`'s field, the field's name), or None: no such field."""
    *path, name = flag.split(".")
    owner = config
    for part in path:
        owner = getattr(owner, part, None)
    if not dataclasses.is_dataclass(owner) or name not in {f.name for f in dataclasses.fields(owner)}:
        return None
    return type(owner), name


def test_every_choice_of_the_launcher_is_its_config_fields_literal():
    config = config_registry.native_qwen3_smoke()
    compared = []
    for var in contract.VARS:
        if var.parse is values.switch:  # a bool's words, not a choice
            continue
        assert hasattr(var.parse, "options") or not var.allowed.startswith("one of:"), (
            f"{var.name}: a choice not made with values.choice (no `options`)"
        )
        if not hasattr(var.parse, "options"):
            continue
        for flag in FLAG.findall(var.flag):
            found = field_of(config, flag)
            if found is None:
                assert flag in CONFIG_MANAGER_FLAGS, f"{var.name}: --{flag} is no field of the Config"
                continue
            literal = settings.choices(*found)
            assert literal, f"{var.name}: --{flag} is a {found[0].__name__} field of no Literal type"
            assert set(var.parse.options) == {str(value) for value in literal}, (
                f"{var.name}={'|'.join(var.parse.options)} but --{flag} takes {'|'.join(map(str, literal))}"
            )
            compared.append(var.name)
    assert {"DPO_LOSS", "METHOD", "NAN_POLICY", "NEURON_LOGICAL_NC_CONFIG", "LR_SCHEDULE"} <= set(compared), compared


def test_dpo_reads_its_losses_from_the_literal():
    from neuron_qwen3.preference import dpo

    assert dpo.LOSSES == settings.choices(settings.Preference, "loss") == ("sigmoid", "ipo")


def test_every_section_is_named_as_its_field_and_builds_with_its_defaults():
    for field in dataclasses.fields(settings.RunSettings):
        section = field.default_factory() if field.default_factory is not dataclasses.MISSING else None
        if isinstance(section, settings.Section):
            assert type(section).__name__.lower() == field.name  # the name its lines give the flags


@pytest.mark.parametrize(
    "flag, says",
    [
        ("--lora.dropout=1.5", "--lora.dropout=1.5 must be in [0, 1)"),
        ("--lora.rank=-1", "--lora.rank=-1 is not 0 (full fine-tuning) or a positive rank"),
        ("--lora.alpha=nan", "--lora.alpha=nan is not 0 (2 x rank) or a positive number"),
        ("--preference.beta=0", "--preference.beta=0.0 is not a positive number"),
        ("--preference.sft_weight=-1", "--preference.sft_weight=-1.0 is not a weight from 0"),
        ("--divergence.window=4", f"--divergence.window=4 is below {settings.MIN_HISTORY}, the losses a spike is"),
        ("--divergence.factor=0", "--divergence.factor=0.0 is not a positive number"),
        ("--samples.tokens=0", "--samples.tokens=0 is not a positive number of tokens"),
        ("--samples.every=-1", "--samples.every=-1 is not 0 or a positive number of steps"),
        ("--export.max_shard_mb=0", "--export.max_shard_mb=0 is not a positive number of MB"),
        ("--moe.z_loss=inf", "--moe.z_loss=inf is not a coefficient from 0"),
        ("--tune.lr=2", "--tune.lr=2.0 is not a learning rate from 0 to 1"),
        ("--tune.warmup=-2", "--tune.warmup=-2.0 is neither a whole number of steps nor a fraction below 1"),
        ("--report.progress_every_s=-1", "--report.progress_every_s=-1.0 is not a number of seconds from 0"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_flag_in_the_pre_launch_pass(flag, says):
    config, problem = preflight.parse_config([*SMOKE, flag], {})
    assert config is None and problem.startswith(says) and "\n" not in problem, problem


def test_a_section_built_by_code_checks_its_choices_and_ranges():
    with pytest.raises(ValueError, match=r"^--preference\.loss=hinge is not one of sigmoid, ipo$"):
        settings.Preference(loss="hinge")
    with pytest.raises(ValueError, match=r"^--neuron\.logical_nc_config=4 is not one of 1, 2$"):
        settings.Neuron(logical_nc_config=4)
    with pytest.raises(ValueError, match=r"^--lora\.dropout=1\.0 must be in \[0, 1\)$"):
        dataclasses.replace(settings.Lora(rank=4), dropout=1.0)
    assert settings.Lora(rank=8, alpha=4).scale == 0.5 and settings.Lora(rank=4, targets=" q_proj,,v_proj").names == (
        "q_proj",
        "v_proj",
    )


def test_the_worker_parse_prints_the_line_and_exits_2(capsys):
    from torchtitan.config import ConfigManager

    with pytest.raises(SystemExit) as exited:
        ConfigManager().parse_args([*SMOKE, "--samples.tokens=0"])
    assert exited.value.code == 2
    assert "--samples.tokens=0 is not a positive number of tokens" in " ".join(capsys.readouterr().err.split())


def test_the_pre_launch_answer_is_the_sections_line(tmp_path):
    """EXTRA_ARGS past the contract (which parses LORA_DROPOUT itself): the launcher's request, answered in process."""
    answer = recipes_pass(tmp_path, EXTRA_ARGS="--lora.dropout=1.5")
    assert answer["problems"] == ["--lora.dropout=1.5 must be in [0, 1)"], answer["problems"]


def test_the_launcher_prints_one_line_and_exits_2(tmp_path):
    status, lines = launcher_errors(tmp_path, EXTRA_ARGS="--divergence.factor=-1")
    assert status == 2 and lines == ["entrypoint: --divergence.factor=-1.0 is not a positive number"], lines


def section_field(config, var):
    """(the project's Section holding `var`'s field, the field) its flag sets, or None: a torchtitan field."""
    for flag in FLAG.findall(var.flag):
        found = field_of(config, flag)
        if found and issubclass(found[0], settings.Section):
            return found[0], {f.name: f for f in dataclasses.fields(found[0])}[found[1]]
    return None


def same_value(parsed, default) -> bool:
    if isinstance(parsed, bool) or isinstance(default, bool):
        return bool(parsed) == bool(default)
    if isinstance(parsed, int | float) and isinstance(default, int | float):
        return float(parsed) == float(default)
    return str(parsed) == str(default)


def test_each_default_the_launcher_states_is_its_config_fields():
    """A variable's `default: X` in the launcher's help (and its own default, which it always passes) is the value
    the project's Config field starts at; a default named as another variable leaves the field unset (None), and a
    default described in words (the config's, INIT_FROM's) is not a value the variable takes."""
    config, compared, described = config_registry.native_qwen3_smoke(), [], []
    for var in contract.VARS:
        found = section_field(config, var)
        stated = re.search(r"default: (.+?)(?:;|,| \(|$)", var.meaning)
        if found is None:
            continue
        section, field = found
        if var.default is not None:
            assert same_value(var.parse(var.default), field.default), (var.name, var.default, field.default)
            compared.append(var.name)
        if stated is None:
            continue
        stated = stated.group(1)
        if stated in {v.name for v in contract.VARS}:
            assert field.default is None, f"{var.name}: default {stated}, but --{field.name} starts at {field.default}"
            compared.append(var.name)
            continue
        valued = settings.choices(section, field.name) or any(t in str(field.type) for t in ("int", "float", "bool"))
        try:
            parsed = var.parse(stated) if valued else None  # a text field's default is always words here
        except ValueError:
            parsed = None
        if parsed is None:
            described.append(var.name)
            continue
        assert same_value(parsed, field.default), (
            f"{var.name}'s help says default: {stated}, but {section.__name__}.{field.name} is {field.default!r}"
        )
        compared.append(var.name)
    assert {"GRPO_GENERATIONS", "GRPO_TOP_P", "GRPO_EPSILON_HIGH", "DPO_BETA", "SAMPLE_TOKENS", "METHOD"} <= set(
        compared
    ), compared
    assert set(described) == {"LORA_ALPHA", "LORA_TARGETS", "MOE_AUX_LOSS", "DPO_REFERENCE", "GRPO_REWARD_WEIGHTS"} | {
        "MODEL",
        "LR",
        "WARMUP_STEPS",
        "SAMPLE_PROMPTS",
        "SAMPLE_INTERVAL",
    }, described  # each says in words what the run derives


PROBES = ("0", "1", "2", "0.5", "0.999", "1e-9", "8", "100", "65536", "1000000")


def test_each_numeric_range_of_the_launcher_is_its_config_fields():
    """A number the launcher takes, the Config section takes; one it refuses, the section refuses, but the
    section's unset default (0 for LoRA's rank: the launcher leaves the variable unset) and a form the launcher's
    pattern does not read (an exponent)."""
    config, probed = config_registry.native_qwen3_smoke(), set()
    for var in contract.VARS:
        found = section_field(config, var)
        if found is None or settings.choices(found[0], found[1].name):
            continue
        section, field = found
        kind = str(field.type)
        if "int" not in kind and "float" not in kind:
            continue
        for raw in PROBES:
            if "float" not in kind and not raw.isdigit():
                continue
            value = float(raw) if "float" in kind else int(raw)
            try:
                var.parse(raw)
                launcher = True
            except ValueError:
                launcher = False
            try:
                dataclasses.replace(getattr(config, section.__name__.lower()), **{field.name: value})
                built = True
            except ValueError:
                built = False
            unset_or_form = value == field.default or "e" in raw
            assert launcher == built or (built and unset_or_form), (
                f"{var.name}={raw}: the launcher {'takes' if launcher else 'refuses'} it, --"
                f"{section.__name__.lower()}.{field.name} {'takes' if built else 'refuses'} it"
            )
            probed.add(var.name)
    assert {"GRPO_TOP_P", "GRPO_TEMPERATURE", "LORA_RANK", "DPO_BETA", "EXPORT_MAX_SHARD_MB"} <= probed, probed
