"""torchtitan 0.3.0's log lines that are untrue of the project's runs (recipes/neuron_qwen3/quirks/titan_logs.py).

Each unit test makes torchtitan's own code log the line twice, in the same situation: stock, where the line must be
there (if upstream stops logging it, the test says the workaround can go), and with the filter installed as the
project installs it, where it must not be. The one training test runs a single CPU INIT_FROM worker with the filter
installed and checks that none of the lines reach the console, and that the filter had them to drop in that very
run. Run: .venv/bin/python -m pytest tests/test_titan_logs.py
"""

import inspect
import json
import logging
import re
import subprocess
import sys

import pytest
import torch
from torchtitan.components.checkpointer import CheckpointManager
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.config import ConfigManager
from torchtitan.models.qwen3 import config_registry as qwen3_configs
from torchtitan.tools import utils
from torchtitan.tools.logging import logger
from torchtitan.trainer import Trainer

from conftest import ANSI, REPO, SCENARIOS, STEP_LOSS, worker_env

from neuron_qwen3 import config_registry  # noqa: F401 (imported here, first: its import may install the filter)
from neuron_qwen3.quirks import titan_logs
from neuron_qwen3.report import flops

A100_LINE = "Peak flops undefined for: cpu, fallback to A100"
A100_USED = "Peak FLOPS used for computing MFU: 3.120e+14"
# torchtitan's Trainer.__init__ (trainer.py:539-540): the two lines replayed below, as written there
TRAINER_PEAK = (
    "gpu_peak_flops = utils.get_peak_flops(device_memory_monitor.device_name)",
    'logger.info(f"Peak FLOPS used for computing MFU: {gpu_peak_flops:.3e}")',
)


@pytest.fixture(autouse=True)
def stock():
    """Every test starts from stock torchtitan logging; the filter is put back after it as it was before."""
    before = titan_logs._filter
    titan_logs.uninstall()
    yield
    titan_logs.uninstall()
    if before is not None:
        titan_logs.install(project_mfu=before.project_mfu)


def messages(caplog) -> list:
    return [record.getMessage() for record in caplog.records]


def init_from_args(tmp_path) -> list:
    """What the launcher passes a worker for INIT_FROM (entrypoint/plan.py), on the native smoke config."""
    return [
        "--module",
        "neuron_qwen3",
        "--config",
        "native_qwen3_smoke",
        "--checkpoint.enable",
        f"--checkpoint.initial_load_path={tmp_path}",
        "--checkpoint.initial_load_in_hf",
        "--checkpoint.initial_load_model_only",
    ]


# ---- 1. initial_load_model_only -------------------------------------------------------------------------------


def test_an_init_from_parse_warns_of_no_initial_load_path_it_has_unless_installed(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    config = ConfigManager().parse_args(init_from_args(tmp_path))  # stock torchtitan
    assert config.checkpoint.initial_load_path == str(tmp_path)  # the run has one: the warning is untrue
    assert messages(caplog).count(titan_logs.MODEL_ONLY) == 1  # from torchtitan's qwen3_1_7b() config function

    caplog.clear()
    titan_logs.install()
    config = ConfigManager().parse_args(init_from_args(tmp_path))
    assert config.checkpoint.initial_load_path == str(tmp_path)
    assert not [m for m in messages(caplog) if "initial_load_model_only" in m]
    assert titan_logs.install().corrected[titan_logs.MODEL_ONLY] == 1


def test_every_checkpoint_config_with_the_defaults_warns_unless_installed(caplog):
    caplog.set_level(logging.INFO)
    qwen3_configs.qwen3_1_7b()  # what _native's config functions start from
    CheckpointManager.Config()  # tyro's parsed Config and Config.build's replace(self) build one like it
    assert messages(caplog).count(titan_logs.MODEL_ONLY) == 2

    caplog.clear()
    titan_logs.install()
    qwen3_configs.qwen3_1_7b()
    CheckpointManager.Config()
    assert titan_logs.MODEL_ONLY not in messages(caplog)


# ---- 2. the A100 fallback of get_peak_flops -------------------------------------------------------------------


def peak_lines_on(monkeypatch, device_type: str, device_name: str, caplog) -> list:
    """torchtitan's peak-FLOPS lines for a worker on `device_type`: get_peak_flops as MetricsProcessor.__init__
    calls it, then Trainer.__init__'s two lines (TRAINER_PEAK), with torchtitan's device choice as on that host."""
    monkeypatch.setattr(utils, "device_type", device_type)
    caplog.clear()
    utils.get_peak_flops(device_name)  # components/metrics.py:347
    gpu_peak_flops = utils.get_peak_flops(device_name)  # trainer.py:539
    logger.info(f"Peak FLOPS used for computing MFU: {gpu_peak_flops:.3e}")  # trainer.py:540
    return messages(caplog)


def test_the_replayed_lines_are_torchtitans():
    assert "self.gpu_peak_flops = utils.get_peak_flops(" in inspect.getsource(MetricsProcessor.__init__)
    source = inspect.getsource(Trainer.__init__)
    assert all(line in source for line in TRAINER_PEAK)
    assert 'logger.warning(f"Peak flops undefined for: {device_name}, fallback to A100")' in inspect.getsource(
        utils.get_peak_flops
    )


def test_cpu_run_claims_an_a100_peak_unless_installed_by_the_project_trainer(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    assert flops.peak("cpu", "cpu").flops is None  # the run report: no MFU on CPU (run_report.RunReport)
    lines = peak_lines_on(monkeypatch, "cpu", "cpu", caplog)  # stock
    assert lines.count(A100_LINE) == 2 and lines.count(A100_USED) == 1

    filter_ = titan_logs.install(project_mfu=True)
    lines = peak_lines_on(monkeypatch, "cpu", "cpu", caplog)
    assert A100_LINE not in lines and not [line for line in lines if "3.120e+14" in line]
    said = [line for line in lines if line.startswith(titan_logs.PEAK_USED)]
    assert said == [
        f"{titan_logs.PEAK_USED}none (CPU: no agreed peak FLOPS for a host CPU, so no MFU); torchtitan's "
        "A100 fallback is not used: its step lines say mfu: N/A, the run report's mfu is null"
    ]
    assert filter_.corrected == {A100_LINE: 2, A100_USED: 1}


def test_a_gpu_not_in_torchtitans_table_gets_the_same_correction(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr("subprocess.run", lambda *a, **k: type("R", (), {"stdout": ""})())  # no lspci lines
    name = "NVIDIA GeForce RTX 4090"
    assert flops.peak("cuda", name).flops is None  # the run report has no MFU there either
    lines = peak_lines_on(monkeypatch, "cuda", name, caplog)
    assert lines.count(f"Peak flops undefined for: {name}, fallback to A100") == 2 and A100_USED in lines

    titan_logs.install(project_mfu=True)
    lines = peak_lines_on(monkeypatch, "cuda", name, caplog)
    assert not [line for line in lines if "fallback to A100" in line or "3.120e+14" in line]
    assert f"none ('{name}' is not in torchtitan's peak table)" in lines[-1]


def test_a_stock_trainer_keeps_its_peak_lines(monkeypatch, caplog):
    """Without project_mfu (no RunReport to turn MFU off), torchtitan does divide by the A100 figure: true there."""
    caplog.set_level(logging.INFO)
    titan_logs.install()
    lines = peak_lines_on(monkeypatch, "cpu", "cpu", caplog)
    assert lines.count(A100_LINE) == 2 and lines.count(A100_USED) == 1


def test_a_known_peak_and_other_records_pass(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    titan_logs.install(project_mfu=True)
    logger.info(f"Peak FLOPS used for computing MFU: {989e12:.3e}")  # an H100: no fallback before it
    logger.warning("%s", titan_logs.MODEL_ONLY)  # not torchtitan's (it logs the literal), so not matched
    logger.info(titan_logs.MODEL_ONLY)  # not its level
    assert messages(caplog) == [
        "Peak FLOPS used for computing MFU: 9.890e+14",
        titan_logs.MODEL_ONLY,
        titan_logs.MODEL_ONLY,
    ]


# ---- the run -------------------------------------------------------------------------------------------------


def tiny_qwen3(folder):
    """A random Qwen3ForCausalLM of the smoke shape (the bundled config.json), saved by transformers."""
    import transformers

    config = json.loads((config_registry.HF_MODEL["smoke"] / "config.json").read_text())
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**config)).save_pretrained(folder)
    return folder


@pytest.mark.training
def test_an_init_from_cpu_run_prints_none_of_them(tmp_path):
    source = tiny_qwen3(tmp_path / "source")
    args = [*init_from_args(source), "--training.steps", "2", "--dump_folder", str(tmp_path / "out")]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=1",
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            "localhost:0",
            str(SCENARIOS / "titan_logs_run.py"),
            *args,
        ],
        env=worker_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = ANSI.sub("", result.stdout + result.stderr)
    assert result.returncode == 0, output[-3000:]
    corrected = json.loads(re.search(r"titan_logs corrected: (.*)", output).group(1))
    output = re.sub(r"titan_logs corrected: .*", "", output)  # the scenario's own line, not the run's log
    steps = [line for line in output.splitlines() if STEP_LOSS.search(line)]
    assert len(steps) == 2 and all(line.endswith("mfu: N/A") for line in steps)  # torchtitan's MFU: off
    for untrue in ("initial_load_model_only", "fallback to A100", "3.120e+14"):
        assert untrue not in output, untrue
    assert output.count(titan_logs.PEAK_USED) == 1 and f"{titan_logs.PEAK_USED}none (CPU: no agreed" in output
    assert f"Loaded the Hugging Face weights of {source}" in output  # the project's own line for its load
    # what stock torchtitan prints in this run: the model-only warning once (the config function's Config, before
    # --checkpoint.initial_load_path applies), the A100 fallback twice, the A100 peak once
    assert corrected == {titan_logs.MODEL_ONLY: 1, A100_LINE: 2, A100_USED: 1}
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert summary["mfu"]["pct"] is None and summary["mfu"]["peak_source"] in output  # the same reason, said once
