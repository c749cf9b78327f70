"""The environment contract: defaults, accepted forms, and one clear error per bad value.

Run: .venv/bin/python -m pytest tests/test_entrypoint_contract.py -q
"""

import dataclasses

import pytest

from entrypoint import contract, hygiene, values
from entrypoint.variants import DEFAULT_VARIANT, RECIPE_MODULE, SCALES, VARIANTS

VAR = {var.name: var for var in contract.VARS}


def test_every_variable_has_a_settings_field_and_an_empty_environment_means_the_defaults():
    settings = contract.parse({})
    assert [field.name for field in dataclasses.fields(settings)] == [var.name.lower() for var in contract.VARS]
    assert [var.name for var in contract.VARS if var.default is None and getattr(settings, var.name.lower())] == []
    assert (
        settings.variant,
        settings.scale,
        settings.compile,
        settings.extra_args,
        settings.checkpoint_dir,
        settings.hf_hub_offline,
        settings.stop_grace,
        settings.log_rank,
        settings.module,
    ) == (DEFAULT_VARIANT, "full", False, (), None, False, 20, "0", RECIPE_MODULE)


@pytest.mark.parametrize("name, values", [("VARIANT", VARIANTS), ("SCALE", SCALES)])
def test_choices_come_from_the_variant_table(name, values):
    for value in values:
        assert getattr(contract.parse({name: value}), name.lower()) == value


@pytest.mark.parametrize("raw", list(values.SWITCH) + ["ON", " Yes "])
def test_compile_switch(raw):
    assert contract.parse({"COMPILE": raw}).compile is values.SWITCH[raw.strip().lower()]


@pytest.mark.parametrize(
    "raw, cores",
    [("3", (3,)), ("0-3", (0, 1, 2, 3)), ("0-3,8", (0, 1, 2, 3, 8)), ("0,2,4-7", (0, 2, 4, 5, 6, 7)), ("5-5", (5,))],
)
def test_visible_core_forms(raw, cores):
    assert contract.parse({"NEURON_RT_VISIBLE_CORES": raw}).neuron_rt_visible_cores == cores


def test_faults_and_preflight_values():
    settings = contract.parse(
        {
            "CHECKPOINT_DIR": "/c",
            "CHECKPOINT_INTERVAL": "5",
            "CHECKPOINT_KEEP": "0",
            "MAX_RESTARTS": "2",
            "STOP_GRACE": "7",
            "PREFLIGHT": "warn",
            "HF_HUB_OFFLINE": "1",
            "NEURON_CC_FLAGS": "--lnc=2 -O1",
        }
    )
    assert (
        settings.checkpoint_dir,
        settings.checkpoint_interval,
        settings.checkpoint_keep,
        settings.max_restarts,
        settings.stop_grace,
        settings.preflight,
        settings.hf_hub_offline,
        settings.neuron_cc_flags,
    ) == ("/c", 5, 0, 2, 7, "warn", True, ("--lnc=2", "-O1"))


def test_every_variable_has_a_docs_group():
    assert {var.group for var in contract.VARS} == {
        "run",
        "paths",
        "rendezvous",
        "kubeflow",
        "slurm",
        "faults",
        "preflight",
    }


def test_numbers_and_words():
    settings = contract.parse({"STEPS": "10", "NPROC": "4", "EXTRA_ARGS": "--a 'b c'", "CUDA_VISIBLE_DEVICES": ""})
    assert (settings.steps, settings.nproc, settings.extra_args) == (10, 4, ("--a", "b c"))
    assert settings.cuda_visible_devices == ()


BAD = [
    ("VARIANT", "foo"),
    ("VARIANT", ""),
    ("SCALE", "huge"),
    ("COMPILE", "maybe"),
    ("STEPS", "abc"),
    ("STEPS", "0"),
    ("STEPS", "-1"),
    ("STEPS", "1.5"),
    ("NPROC", "x"),
    ("NPROC", "0"),
    ("NEURON_LOGICAL_NC_CONFIG", "3"),
    ("NEURON_RT_VISIBLE_CORES", "3-1"),
    ("NEURON_RT_VISIBLE_CORES", "0-3,2"),
    ("NEURON_RT_VISIBLE_CORES", "a"),
    ("NEURON_RT_VISIBLE_CORES", ""),
    ("NEURON_RT_VISIBLE_CORES", "1,,2"),
    ("NEURON_RT_VISIBLE_CORES", "3-"),
    ("NEURON_RT_VISIBLE_CORES", "-3"),
    ("EXTRA_ARGS", "--a 'open"),
    ("CHECKPOINT_INTERVAL", "0"),
    ("CHECKPOINT_KEEP", "1"),
    ("CHECKPOINT_KEEP", "-2"),
    ("MAX_RESTARTS", "-1"),
    ("STOP_GRACE", "0"),
    ("STOP_GRACE", "1.5"),
    ("PREFLIGHT", "off"),
    ("HF_HUB_OFFLINE", "maybe"),
    ("NEURON_CC_FLAGS", "--lnc='2"),
    ("MODEL", "Qwen/Qwen2-7B"),
    ("MODEL", "meta-llama/Llama-3-8B"),
    ("MODEL", "Qwen/Qwen3-8b"),
    ("NEURON_QWEN3_MOE_KERNEL", "NKI"),
    ("LR", "nan"),
    ("LR", "inf"),
    ("LR", "1e999"),
    ("LR", "-1e-5"),
    ("LR", "2"),
    ("LR", "0x1"),
    ("LR", "1_0"),
    ("LR", "2e-5 "),
    ("WARMUP_STEPS", "1.5"),
    ("WARMUP_STEPS", "1.0"),
    ("WARMUP_STEPS", "-3"),
    ("WARMUP_STEPS", "nan"),
    ("WARMUP_STEPS", "0.0"),
    ("WARMUP_STEPS", "1e-2"),
    ("LR_SCHEDULE", "constant"),
    ("LR_SCHEDULE", "Cosine"),
    ("BATCH_SIZE", "0"),
    ("BATCH_SIZE", "2.5"),
    ("SEQ_LEN", "0"),
    ("SEQ_LEN", "1e3"),
    ("SEED", "-1"),
    ("SEED", "4294967296"),
    ("NAN_POLICY", "ignore"),
    ("VALIDATION", ""),
    ("VALIDATION", "0"),
    ("VALIDATION", "1"),
    ("VALIDATION", "0.0"),
    ("VALIDATION", "1.5"),
    ("VALIDATION", "5"),
    ("VALIDATION", "-0.1"),
    ("VALIDATION", "--training.steps=9"),
    ("VALIDATION", "a\nb"),
    ("VALIDATION_INTERVAL", "0"),
    ("VALIDATION_INTERVAL", "2.5"),
    ("EPOCHS", "0"),
    ("EPOCHS", "-1"),
    ("EPOCHS", "1.5"),
    ("EPOCHS", "three"),
    ("EPOCHS", " 2"),
    ("MOE_AUX_LOSS", "-1"),
    ("MOE_AUX_LOSS", "-0"),
    ("MOE_AUX_LOSS", "nan"),
    ("MOE_AUX_LOSS", "inf"),
    ("MOE_AUX_LOSS", "0x1"),
    ("MOE_AUX_LOSS", ""),
    ("MOE_Z_LOSS", "-0.001"),
    ("MOE_Z_LOSS", "1e-3 "),
    ("MOE_Z_LOSS", "off"),
    ("MOE_ROUTER", "thaw"),
    ("MOE_ROUTER", "Freeze"),
    ("MOE_ROUTER", ""),
    ("MOE_AUX_LOSS", "1e999"),
    ("MOE_Z_LOSS", "1e999"),
    ("LORA_ALPHA", "1e999"),
]
# Variables whose value is free text (paths, ids, tokens, shell words): passed as one argv word, never to a shell.
FREE_TEXT = {
    "EXTRA_ARGS",
    "INIT_FROM",
    "EXPORT_DIR",
    "DATASET",
    "WANDB_MODE",
    "WANDB_API_KEY",
    "ASSETS_DIR",
    "OUTPUT_DIR",
    "CACHE_DIR",
    "CHECKPOINT_DIR",
    "CUDA_VISIBLE_DEVICES",
    "HF_TOKEN",
    "NEURON_CC_FLAGS",
    "VALIDATION",
    "SAMPLE_PROMPTS",
    "DPO_REFERENCE",
}
HOSTILE = ["$(reboot)", "1;reboot", "`id`", "1\n2", "", "\x00", "../../etc/passwd", "1 --training.steps=9"]


@pytest.mark.parametrize("raw", ["0.05", ".5", "0.999", "data/val.jsonl", "/data/val", "val.parquet"])
def test_validation_is_a_fraction_or_a_path(raw):
    assert contract.parse({"VALIDATION": raw}).validation == raw


@pytest.mark.parametrize("name, raw", BAD)
def test_bad_value_names_variable_value_and_allowed(name, raw):
    with pytest.raises(contract.UsageError) as error:
        contract.parse({name: raw})
    assert str(error.value) == f"{name}={raw!r} is not {VAR[name].allowed}"


@pytest.mark.parametrize("raw", HOSTILE)
@pytest.mark.parametrize("name", sorted(set(VAR) - FREE_TEXT))
def test_every_structured_variable_refuses_hostile_values_in_one_line(name, raw):
    """Each variable that is not free text, new ones included (the table drives it): one line, as parse says it."""
    with pytest.raises(contract.UsageError) as error:
        contract.parse({name: raw})
    assert str(error.value) == f"{name}={raw!r} is not {VAR[name].allowed}" and "\n" not in str(error.value)


def test_the_fine_tuning_knobs_parse_to_their_flag_values():
    settings = contract.parse(
        {
            "LR": "2e-5",
            "WARMUP_STEPS": "0.03",
            "LR_SCHEDULE": "sqrt",
            "BATCH_SIZE": "32",
            "SEQ_LEN": "2048",
            "SEED": "0",
            "NAN_POLICY": "warn",
        }
    )
    assert (
        settings.lr,
        settings.warmup_steps,
        settings.lr_schedule,
        settings.batch_size,
        settings.seq_len,
        settings.seed,
        settings.nan_policy,
    ) == (2e-5, "0.03", "sqrt", 32, 2048, 0, "warn")
    assert (contract.parse({"WARMUP_STEPS": "100"}).warmup_steps, contract.parse({"LR": ".5"}).lr) == ("100", 0.5)
    assert contract.parse({}).nan_policy == "stop"


def test_secrets_are_redacted_and_kept_out_of_repr():
    env = {"HF_TOKEN": "hf_secret\n", "WANDB_API_KEY": "wandb_key"}
    settings = contract.parse(env)
    assert "hf_secret" not in repr(settings) and "wandb_key" not in repr(settings)
    assert hygiene.redact("a hf_secret b wandb_key", env) == "a *** b ***"
    assert hygiene.redact("a b", {}) == "a b"


def test_values_are_parsed_to_their_final_types():
    settings = contract.parse({"NEURON_LOGICAL_NC_CONFIG": "1", "PET_NPROC_PER_NODE": "auto", "MODEL": "Qwen/Qwen3-8B"})
    assert settings.neuron_logical_nc_config == 1 and settings.pet_nproc_per_node is None
    assert contract.parse({"PET_NPROC_PER_NODE": "8"}).pet_nproc_per_node == 8
    fields = {field.name: field.type for field in dataclasses.fields(settings)}
    assert fields["neuron_logical_nc_config"] == int | None and fields["compile"] == bool | None
    assert fields["extra_args"] == tuple | None and fields["model"] == str | None


@pytest.mark.parametrize("model", ["Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B-Base", "Qwen/Qwen3-30B-A3B-Instruct-2507"])
def test_model_takes_any_qwen3_hub_id(model):
    assert contract.parse({"MODEL": model}).model == model


def test_the_hub_token_reaches_the_asset_fetch_alone_stripped():
    environ = {"PATH": "/bin", "HF_TOKEN": "hf_from_a_file\n", "WANDB_API_KEY": "wandb_key"}
    assert hygiene.child_env(environ, fetch=True) == {"PATH": "/bin", "HF_TOKEN": "hf_from_a_file"}
    assert hygiene.child_env(environ) == {"PATH": "/bin", "WANDB_API_KEY": "wandb_key"}  # workers log to W&B
    assert hygiene.child_env({"PATH": "/bin", "HF_TOKEN": ""}, fetch=True) == {"PATH": "/bin"}
