"""The fine-tune pre-launch checks (INIT_FROM, EXPORT_DIR): one line each, before torchrun, stdlib only.

Each case builds a real plan at smoke scale on 2 CPU cores and a Hugging Face folder holding a config.json and a
safetensors header (all the checks read), then calls the check, or the launcher with --check.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint import contract, hf_folder, plan, preflight
from entrypoint.discovery import Devices

REPO = Path(__file__).resolve().parent.parent
CPU = Devices("cpu", 2)
SMOKE_CONFIG = json.loads((Path(preflight.SMOKE_DENSE_CONFIG) / "config.json").read_text())


def build(**env):
    env = {"SCALE": "smoke", **env}
    settings = contract.parse(env)
    return plan.build(settings, CPU, env), settings


def hf_model(folder, parameters=1 << 20, **changes):
    """A model folder: the dense smoke config.json with `changes`, one F32 tensor of `parameters` in a header."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**SMOKE_CONFIG, **changes}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [parameters], "data_offsets": [0, 4 * parameters]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    return folder


def one_failure(findings):
    assert [f.fatal for f in findings] == [True], findings
    assert "\n" not in findings[0].text
    return findings[0].text


def test_the_smoke_shape_passes(tmp_path):
    source = hf_model(tmp_path / "m")
    assert preflight.init_from(*build(VARIANT="native", INIT_FROM=str(source))) == []


def test_another_architecture_is_refused(tmp_path):
    source = hf_model(tmp_path / "m")
    text = one_failure(preflight.init_from(*build(VARIANT="nki_moe", INIT_FROM=str(source))))
    assert text == f"INIT_FROM={str(source)!r} holds a 'qwen3' model but VARIANT=nki_moe trains 'qwen3_moe'"


def test_a_shape_mismatch_names_the_first_differing_field_and_both_values(tmp_path):
    changed = {"num_hidden_layers": SMOKE_CONFIG["num_hidden_layers"] + 1,
               "hidden_size": SMOKE_CONFIG["hidden_size"] * 2}
    source = hf_model(tmp_path / "m", **changed)
    first = next(name for name in hf_folder.SHAPE_FIELDS if name in changed)
    text = one_failure(preflight.init_from(*build(VARIANT="v5", INIT_FROM=str(source))))
    assert text == (f"INIT_FROM={str(source)!r} has {first}={changed[first]!r} but the run trains "
                    f"{first}={SMOKE_CONFIG[first]!r}")


@pytest.mark.parametrize("case", ["no folder", "no config", "no weights", "index names a missing shard"])
def test_a_folder_that_is_not_a_model(tmp_path, case):
    source = tmp_path / "m"
    if case != "no folder":
        hf_model(source)
    if case == "no config":
        (source / "config.json").unlink()
    elif case == "no weights":
        (source / "model.safetensors").unlink()
    elif case == "index names a missing shard":
        (source / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"w": "model-00001-of-00002.safetensors"}}))
    text = one_failure(preflight.init_from(*build(INIT_FROM=str(source))))
    assert text.startswith(f"INIT_FROM={str(source)!r}: ")


def test_export_dir_inside_checkpoint_dir_is_refused(tmp_path):
    export = tmp_path / "ckpt" / "hf"
    text = one_failure(preflight.export_dir(*build(CHECKPOINT_DIR=str(tmp_path / "ckpt"), EXPORT_DIR=str(export))))
    assert text.startswith(f"EXPORT_DIR={str(export)!r} is inside CHECKPOINT_DIR")
    assert preflight.export_dir(*build(CHECKPOINT_DIR=str(tmp_path / "ckpt"), EXPORT_DIR=str(tmp_path / "hf"))) == []


@pytest.mark.parametrize("dtype, size", [("float32", 4), ("bfloat16", 2)])
def test_too_little_disk_for_the_export(tmp_path, monkeypatch, dtype, size):
    parameters = 8 << 20
    source = hf_model(tmp_path / "m", parameters=parameters)
    needed = parameters * size
    real = shutil.disk_usage
    seen = []

    def disk_usage(path, free=needed - 1):
        seen.append(path)
        return real(path)._replace(free=free)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    settings = dict(INIT_FROM=str(source), EXPORT_DIR=str(tmp_path / "out" / "hf"), EXPORT_DTYPE=dtype)
    text = one_failure(preflight.export_dir(*build(**settings)))
    assert text == (f"EXPORT_DIR={settings['EXPORT_DIR']!r} has {(needed - 1) >> 20} MiB free but the export needs "
                    f"about {needed >> 20} MiB")
    assert seen == [str(tmp_path)]  # the nearest existing folder above the export
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=needed))
    assert preflight.export_dir(*build(**settings)) == []


def complete_checkpoint(folder):
    """A step folder checkpoints.scan counts as complete (the HF-format form: an index and its shard)."""
    step = folder / "step-5"
    step.mkdir(parents=True)
    (step / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model.safetensors"}}))
    (step / "model.safetensors").write_bytes(b"x")
    return folder


def test_resuming_wins_over_init_from_with_one_notice(tmp_path):
    source, checkpoint = hf_model(tmp_path / "m"), complete_checkpoint(tmp_path / "ckpt")
    findings = preflight.init_from(*build(INIT_FROM=str(source), CHECKPOINT_DIR=str(checkpoint)))
    assert [f.fatal for f in findings] == [False]
    assert findings[0].text.startswith("INIT_FROM is ignored: CHECKPOINT_DIR") and str(checkpoint) in findings[0].text
    # even a folder that would fail the check is not read: the run resumes instead
    broken = hf_model(tmp_path / "other", hidden_size=1)
    assert [f.fatal for f in preflight.init_from(*build(INIT_FROM=str(broken), CHECKPOINT_DIR=str(checkpoint)))] \
        == [False]
    result = subprocess.run([sys.executable, "-m", "entrypoint", "--check"], cwd=REPO, capture_output=True, text=True,
                            timeout=60, env={"PATH": os.environ["PATH"], "SCALE": "smoke", "INIT_FROM": str(broken),
                                             "CHECKPOINT_DIR": str(checkpoint), "OUTPUT_DIR": str(tmp_path / "out"),
                                             "CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    notices = [line for line in result.stderr.splitlines() if "INIT_FROM" in line]
    assert notices == [f"entrypoint: warning: {findings[0].text}"]
