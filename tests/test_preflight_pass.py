"""The recipes' pre-launch pass (recipes/neuron_qwen3/prelaunch/preflight.py): the checks that need the real libraries.

In process here (this interpreter has torch): the config parsed from the workers' exact arguments, a Hugging Face
folder written with safetensors, the export's room. The launcher runs the same pass in a child before torchrun
(tests/test_entrypoint_usage.py: a wrong flag; below: the whole pass through `--check`).
Run: .venv/bin/python -m pytest tests/test_preflight_pass.py -q
"""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from conftest import REPO, launcher_at
from neuron_qwen3 import config_registry, shapes
from neuron_qwen3.prelaunch import model_folder, preflight, versions

SMOKE_CONFIG = json.loads((config_registry.HF_MODEL["smoke"] / "config.json").read_text())


def config(*flags, config="native_qwen3_smoke"):
    parsed, problem = preflight.parse_config(["--module", "neuron_qwen3", "--config", config, *flags], {})
    assert problem is None, problem
    return parsed


def hf_model(folder, parameters=1 << 10, **changes):
    """A model folder: the dense smoke config.json with `changes` and one real F32 tensor of `parameters`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**SMOKE_CONFIG, **changes}))
    save_file({"w": torch.zeros(parameters)}, str(folder / "model.safetensors"))
    return folder


def loading(source, *flags, config_name="native_qwen3_smoke"):
    return config(
        "--checkpoint.enable",
        f"--checkpoint.initial_load_path={source}",
        "--checkpoint.initial_load_in_hf",
        *flags,
        config=config_name,
    )


def test_the_smoke_shape_passes(tmp_path):
    parsed = loading(hf_model(tmp_path / "m"))
    assert model_folder.init_from(parsed, model_folder.trained_shape(parsed), None) == ([], [])


def test_another_architecture_is_refused(tmp_path):
    parsed = loading(hf_model(tmp_path / "m"), config_name="nki_moe_qwen3_smoke")
    problems, _ = model_folder.init_from(parsed, model_folder.trained_shape(parsed), None)
    assert problems == [
        f"INIT_FROM='{tmp_path / 'm'}' has model_type='qwen3' but the run trains model_type='qwen3_moe'"
    ]


@pytest.mark.parametrize("config_name", ["native_qwen3_smoke", "v5_qwen3_smoke"])
def test_a_shape_mismatch_names_the_first_differing_field_and_both_values(tmp_path, config_name):
    source = hf_model(
        tmp_path / "m",
        num_hidden_layers=SMOKE_CONFIG["num_hidden_layers"] + 1,
        hidden_size=SMOKE_CONFIG["hidden_size"] * 2,
    )
    parsed = loading(source, config_name=config_name)
    problems, _ = model_folder.init_from(parsed, model_folder.trained_shape(parsed), None)
    assert problems == [
        f"INIT_FROM='{source}' has hidden_size={SMOKE_CONFIG['hidden_size'] * 2} but the run trains "
        f"hidden_size={SMOKE_CONFIG['hidden_size']}"
    ]


@pytest.mark.parametrize("case", ["no folder", "no config", "no weights", "not safetensors"])
def test_a_folder_that_is_not_a_model(tmp_path, case):
    source = tmp_path / "m"
    if case != "no folder":
        hf_model(source)
    if case == "no config":
        (source / "config.json").unlink()
    elif case == "no weights":
        (source / "model.safetensors").unlink()
    elif case == "not safetensors":
        (source / "model.safetensors").write_bytes(b"\x00" * 64)
    parsed = loading(source)
    problems, _ = model_folder.init_from(parsed, model_folder.trained_shape(parsed), None)
    assert len(problems) == 1 and "\n" not in problems[0] and problems[0].startswith(f"INIT_FROM='{source}': ")


def test_resuming_wins_over_init_from_with_one_notice(tmp_path):
    broken = hf_model(tmp_path / "other", hidden_size=1)
    parsed = loading(broken, f"--checkpoint.folder={tmp_path / 'ckpt'}")
    problems, warnings = model_folder.init_from(parsed, model_folder.trained_shape(parsed), 5)
    assert problems == [] and warnings == [
        f"INIT_FROM is ignored: {tmp_path / 'ckpt'} holds a complete checkpoint (step 5), and the run resumes from it"
    ]


def test_export_inside_the_checkpoint_folder_is_refused(tmp_path):
    from neuron_qwen3.prelaunch import stages

    inside = config(
        "--checkpoint.enable", f"--checkpoint.folder={tmp_path / 'ckpt'}", f"--export.dir={tmp_path / 'ckpt' / 'hf'}"
    )
    assert stages.export(inside, 10)[0].startswith(f"EXPORT_DIR='{tmp_path / 'ckpt' / 'hf'}' is inside CHECKPOINT_DIR")
    beside = config(
        "--checkpoint.enable", f"--checkpoint.folder={tmp_path / 'ckpt'}", f"--export.dir={tmp_path / 'hf'}"
    )
    assert stages.export(beside, 10) == []


@pytest.mark.parametrize("dtype, size", [("float32", 4), ("bfloat16", 2)])
def test_too_little_disk_for_the_export(tmp_path, monkeypatch, dtype, size):
    from neuron_qwen3.prelaunch import stages

    parameters = 8 << 20
    needed = parameters * size
    real = shutil.disk_usage
    seen = []
    monkeypatch.setattr(shutil, "disk_usage", lambda path: seen.append(path) or real(path)._replace(free=needed - 1))
    parsed = config(f"--export.dir={tmp_path / 'out' / 'hf'}", f"--export.dtype={dtype}")
    assert stages.export(parsed, parameters) == [
        f"EXPORT_DIR='{tmp_path / 'out' / 'hf'}' has {(needed - 1) >> 20} MiB free but the export needs about "
        f"{needed >> 20} MiB"
    ]
    assert seen == [str(tmp_path)]  # the nearest existing folder above the export
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=needed))
    assert stages.export(parsed, parameters) == []


def test_the_answer_states_the_model_and_how_it_fits():
    answer = preflight.run(
        {
            "args": ["--module", "neuron_qwen3", "--config", "native_qwen3_8b", "--device=neuron"],
            "ranks": 8,
            "print_config": True,
        }
    )
    assert answer["problems"] == [] and answer["config"]["report"]["model"] == "Qwen/Qwen3-8B"
    assert answer["model"]["parameters"] == shapes.FLAVORS["8B"].parameters() and not answer["model"]["fits"]
    assert answer["warnings"] == [f"Qwen/Qwen3-8B: {answer['model']['why']}"]


def test_the_dataset_is_scanned_record_by_record(tmp_path):
    """Multi-turn conversations pass (the old pass refused all but one user and one assistant turn) and are
    counted; a bad record further down is the problem, named by its line; TRAIN_ON's flag parses, a bad value is
    tyro's one line."""
    turns = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "6"},
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text((json.dumps({"messages": turns}) + "\n") * 2)

    def check(*flags):
        args = [
            "--module",
            "neuron_qwen3",
            "--config",
            "native_qwen3_smoke",
            f"--dataloader.source={path}",
            "--dataloader.field=messages",
            *flags,
        ]
        return preflight.run({"args": args, "ranks": 1, "check_files": True, "node_rank": 0})

    answer = check("--dataloader.train_on=last")
    assert answer["problems"] == [] and f"dataset: 2 records, 10 turns in {path}" in answer["lines"]
    with path.open("a") as f:
        f.write(json.dumps({"messages": turns[:2]}) + "\n")
    assert check()["problems"] == [f"DATASET: {path}:3: no assistant turn: nothing to train on"]
    assert check("--dataloader.train_on=first")["problems"] == [
        "torchtitan arguments: invalid choice 'first' for argument '--dataloader.train-on'. Expected one of "
        "('assistant', 'last', 'all')."
    ]


def test_the_tyro_box_becomes_one_line():
    text = (
        "\n Unrecognized options\n "
        + "-" * 40
        + "\n  Unrecognized options: --training.stepz, 3\n  "
        + "-" * 40
        + "\n  Perhaps you meant:\n      --training.steps INT\n          How many (default: 10)\n"
        "      --training.dtype {bfloat16,float32}\n          torch dtype\n"
    )
    assert preflight.tyro_line(text) == (
        "Unrecognized options: --training.stepz, 3 (nearest: --training.steps, --training.dtype)"
    )


def test_check_runs_the_pass_through_the_launcher(tmp_path):
    """INIT_FROM of another shape: one line from the child, exit 2, nothing started."""
    (tmp_path / "dev" / "shm").mkdir(parents=True)
    source = hf_model(tmp_path / "m", num_hidden_layers=3)
    result = subprocess.run(
        launcher_at(tmp_path, "--check"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": os.environ["PATH"],
            "SCALE": "smoke",
            "INIT_FROM": str(source),
            "OUTPUT_DIR": str(tmp_path / "out"),
            "CACHE_DIR": str(tmp_path / "cache"),
        },
    )
    assert result.returncode == 2 and result.stderr.splitlines() == [
        f"entrypoint: INIT_FROM='{source}' has num_hidden_layers=3 but the run trains num_hidden_layers=2"
    ]
    assert "the launch would stop" in result.stdout


# ---- versions against the locks


def locks(tmp_path, image="", host=""):
    if image is not None:
        (tmp_path / "requirements.lock").write_text(image)
    if host is not None:
        (tmp_path / "requirements-torch.lock").write_text(host)
    return tmp_path


IMAGE_LOCK = """# autogenerated
torchtitan==0.3.0 \\
    --hash=sha256:abc
transformers==5.16.0 ; python_version >= "3.11" \\
    --hash=sha256:def
huggingface-hub==1.33.0 \\
"""
HOST_LOCK = "torch==2.14.1 \\\n    --hash=sha256:123\n"
INSTALLED = {"torch": "2.14.1+cpu", "transformers": "5.16.0", "torchtitan": "0.3.0"}


def fake_version(installed):
    def version(name):
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    return version


def test_lock_parsing(tmp_path):
    pins = versions.pins(locks(tmp_path, IMAGE_LOCK) / "requirements.lock")
    assert pins == {"torchtitan": {"0.3.0"}, "transformers": {"5.16.0"}, "huggingface-hub": {"1.33.0"}}


def test_matching_versions_pass_and_local_labels_are_accepted(tmp_path):
    assert versions.versions(locks(tmp_path, IMAGE_LOCK, HOST_LOCK), fake_version(INSTALLED), neuron_dlc=False) == (
        [],
        [],
    )


@pytest.mark.parametrize(
    "installed, words",
    [
        ({**INSTALLED, "torch": "2.13.0"}, ["torch 2.13.0 is installed", "requirements-torch.lock pins 2.14.1"]),
        ({**INSTALLED, "transformers": "5.24.0"}, ["transformers 5.24.0", "requirements.lock pins 5.16.0"]),
        ({"torch": "2.14.1", "transformers": "5.16.0"}, ["torchtitan is not installed", "pins 0.3.0"]),
    ],
)
def test_a_version_off_the_lock_fails(tmp_path, installed, words):
    problems, warnings = versions.versions(
        locks(tmp_path, IMAGE_LOCK, HOST_LOCK), fake_version(installed), neuron_dlc=False
    )
    assert len(problems) == 1 and not warnings and all(word in problems[0] for word in words), problems


def test_on_the_neuron_dlc_the_host_torch_lock_is_not_read(tmp_path):
    installed = {**INSTALLED, "torch": "2.14.0", "torch-neuronx": "2.14.3.1"}
    assert versions.versions(locks(tmp_path, IMAGE_LOCK, HOST_LOCK), fake_version(installed), neuron_dlc=True) == (
        [],
        [],
    )


def test_a_missing_lock_is_a_warning_and_skips_its_pins(tmp_path):
    problems, warnings = versions.versions(
        locks(tmp_path, None, HOST_LOCK), fake_version({"torch": "2.14.1"}), neuron_dlc=False
    )
    assert problems == [] and len(warnings) == 1 and "requirements.lock" in warnings[0]


FORK_BUILD = """# written at image build by ci/image/record-build.py
# TORCHTITAN=neuron
torch==2.14.0
torch-neuronx==2.14.3.1
torchtitan==0.2.2+neuron.1
transformers==5.16.0
"""


def test_in_an_image_built_with_the_fork_its_recorded_torchtitan_is_the_one_checked(tmp_path):
    (locks(tmp_path, IMAGE_LOCK, HOST_LOCK) / versions.IMAGE_BUILD).write_text(FORK_BUILD)
    assert versions.built_with(tmp_path) == "neuron"
    fork = {"torch": "2.14.0", "torch-neuronx": "2.14.3.1", "torchtitan": "0.2.2+neuron.1", "transformers": "5.16.0"}
    assert versions.versions(tmp_path, fake_version(fork), neuron_dlc=True) == ([], [])
    problems, _ = versions.versions(tmp_path, fake_version({**fork, "torchtitan": "0.3.0"}), neuron_dlc=True)
    assert [text.split(":")[0] for text in problems] == [
        "torchtitan 0.3.0 is installed but image-build.lock (this image was built with TORCHTITAN=neuron) pins "
        "0.2.2+neuron.1"
    ]


def test_the_bases_torch_neuronx_is_checked_against_the_build_record(tmp_path):
    (locks(tmp_path, IMAGE_LOCK, HOST_LOCK) / versions.IMAGE_BUILD).write_text(FORK_BUILD)
    changed = {"torch": "2.14.0", "torch-neuronx": "2.14.4.0", "torchtitan": "0.2.2+neuron.1", "transformers": "5.16.0"}
    problems, _ = versions.versions(tmp_path, fake_version(changed), neuron_dlc=True)
    assert len(problems) == 1 and problems[0].startswith("torch-neuronx 2.14.4.0 is installed")


def test_outside_an_image_there_is_no_build_record_and_no_warning_about_it(tmp_path):
    assert versions.built_with(locks(tmp_path, IMAGE_LOCK, HOST_LOCK)) is None
    assert versions.versions(tmp_path, fake_version(INSTALLED), neuron_dlc=False) == ([], [])


def test_this_venv_matches_its_own_locks():
    assert versions.versions(REPO) == ([], [])


def test_a_moe_folder_saved_by_transformers_is_read_as_transformers_reads_it(tmp_path):
    """transformers 5 writes num_experts as `num_local_experts`; the check reads config.json through AutoConfig."""
    import transformers

    from neuron_qwen3.hf import weights

    parsed = loading(tmp_path / "moe", config_name="nki_moe_qwen3_smoke")
    shape = weights.native_hf_config(parsed.model_spec.model, {})
    transformers.Qwen3MoeConfig(**shape).save_pretrained(tmp_path / "moe")
    save_file({"w": torch.zeros(4)}, str(tmp_path / "moe" / "model.safetensors"))
    assert "num_local_experts" in json.loads((tmp_path / "moe" / "config.json").read_text())
    assert model_folder.init_from(parsed, model_folder.trained_shape(parsed), None) == ([], [])
    transformers.Qwen3MoeConfig(**{**shape, "num_experts": 8}).save_pretrained(tmp_path / "moe")
    assert model_folder.init_from(parsed, model_folder.trained_shape(parsed), None)[0] == [
        f"INIT_FROM='{tmp_path / 'moe'}' has num_experts=8 but the run trains num_experts=4"
    ]


def test_the_pass_never_imports_inductor(tmp_path):
    """quirks/import_compile.py: torchtitan's import compiles flex attention, which would import Inductor's compile
    machinery (about 1.5 s); the pass runs no model, so its child finishes without it."""
    request = {
        "args": ["--module", "neuron_qwen3", "--config", "native_qwen3_smoke", "--device=cpu"],
        "model": "",
        "variant": "native",
        "locks": str(REPO),
        "ranks": 1,
        "print_config": False,
        "check_files": True,
        "fix_checkpoints": False,
        "node_rank": 0,
    }
    code = (
        "import contextlib, io, json, sys\n"
        "from neuron_qwen3.prelaunch import preflight\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    preflight.main()\n"
        "answer = json.loads(out.getvalue().splitlines()[-1])\n"
        "print(json.dumps([answer['problems'], 'torch._inductor.compile_fx' in sys.modules]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(request), capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.splitlines()[-1]) == [[], False]
