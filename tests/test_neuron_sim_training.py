"""Every variant trains on the simulated `neuron` device (tests/neuron_sim), 2 ranks, and equals the same run on CPU.

Run: .venv/bin/python -m pytest tests/test_neuron_sim_training.py -q

The article's command (stock `torchtitan.train --module neuron_qwen3 --config <variant>_smoke --device neuron`), on
the same Hugging Face weights (INIT_FROM) at float32, so that both sides do the same host arithmetic, with a
validation, samples, a checkpoint save and the export (tests/neuron_sim/census.py defines the launches). The device
path differs from the CPU path in the device (torchtitan's device module, the `neuron` process group under FSDP2 and
DCP, the RNG tracker) and in attention (document attention's PyTorch reference in place of flex attention, which
needs Inductor). NKI cannot run here, so both kernels are the references. Each step's loss and gradient norm, and
each validation loss, must agree within 1e-5 relative, and the greedy samples token for token: any gap would be a
real difference of path. The exported weights are compared to what training changed (see that test). A third run
of each variant, at its own precision, records the census: docs/neuron-ops.md must be what it recorded.
"""

import importlib.util
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import folder_tensors, side_by_side_env
from test_finetune_variants import save_dense, save_moe
from test_neuron_sim import SIM, build_tools  # noqa: F401  (build_tools: the C++ tool check, for this module too)

_spec = importlib.util.spec_from_file_location("neuron_sim_census", SIM / "census.py")
census = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(census)


def metrics(output) -> list[dict]:
    return [json.loads(line) for line in (output / "report" / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Each variant's runs: {variant: {"cpu" and "neuron" (the comparison), "census": output folders, "init_from":
    the weights they load}}."""
    root = tmp_path_factory.mktemp("sim_training")
    save_dense(root / "dense")
    save_moe(root / "moe")
    env = side_by_side_env()
    del env["SAMPLE_PROMPTS"]  # the smoke config's bundled prompts: samples run on the device too
    kinds = ("cpu", "neuron", "census")
    found = {v: {k: root / v / k for k in kinds} for v in census.VARIANTS}
    for v in census.VARIANTS:
        found[v]["init_from"] = root / ("moe" if v == "nki_moe" else "dense")

    def launch(variant, kind):
        device = "cpu" if kind == "cpu" else "neuron"
        output, init_from = found[variant][kind], found[variant]["init_from"]
        return variant, kind, census.launch(variant, device, output, init_from, env, census=kind == "census")

    with ThreadPoolExecutor(2) as pool:  # two launches at a time
        for variant, kind, done in pool.map(launch, *zip(*[(v, k) for v in found for k in kinds])):
            assert done.returncode == 0, f"{variant}, {kind} run:\n{done.stderr[-4000:]}"
    return found


@pytest.mark.training
@pytest.mark.parametrize("variant", census.VARIANTS)
def test_variant_trains_on_neuron_as_on_cpu(runs, variant):
    on_cpu, on_neuron = (metrics(runs[variant][device]) for device in ("cpu", "neuron"))
    steps = [r for r in on_neuron if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, census.STEPS + 1))
    assert len(on_neuron) == len(on_cpu)
    for cpu, neuron in zip(on_cpu, on_neuron):
        assert cpu["step"] == neuron["step"]
        for name in ("loss", "grad_norm", "validation_loss"):
            if name in cpu:
                assert neuron[name] == pytest.approx(cpu[name], rel=1e-5), (name, cpu["step"])
    assert sum("validation_loss" in r for r in on_neuron) >= 2, "validations at steps 2, 4 and the last"
    assert steps[-1]["loss"] != steps[0]["loss"], "the steps trained"
    neuron = runs[variant]["neuron"]
    assert (neuron / "checkpoint" / f"step-{census.STEPS}").is_dir(), "DCP saved the last step from the device"
    summary = json.loads((neuron / "report" / "summary.json").read_text())
    assert summary["end"] == "finished", summary
    answers = {
        device: [json.loads(line)["tokens"] for line in (runs[variant][device] / "report" / "samples.jsonl").open()]
        for device in ("cpu", "neuron")
    }
    assert answers["neuron"] and answers["neuron"] == answers["cpu"], "the same greedy answers on the device"


@pytest.mark.training
@pytest.mark.parametrize("variant", census.VARIANTS)
def test_the_devices_export_is_the_cpus_and_transformers_reads_it(runs, variant):
    """The float32 exports agree to a thousandth of what the 5 steps changed, tensor by tensor (Frobenius norms).
    Not to 1e-5 of each value: AdamW's update is about lr in size wherever a gradient is not ~0, so the two paths'
    last-digit differences (attention's summation order) move a near-zero gradient's update by up to ~1% of the
    largest. A wrong path moves whole tensors: a ratio near 1."""
    import transformers

    exported = {device: runs[variant][device] / "export" for device in ("cpu", "neuron")}
    cpu, neuron = (folder_tensors(folder) for folder in exported.values())
    initial = folder_tensors(runs[variant]["init_from"])
    assert cpu.keys() == neuron.keys() == initial.keys()
    for name, tensor in cpu.items():
        assert neuron[name].dtype == tensor.dtype == torch.float32
        ratio = (neuron[name] - tensor).norm() / (tensor - initial[name]).norm()
        assert ratio < 1e-3, (name, ratio.item())
    tokens = torch.randint(0, 2048, (1, 64), generator=torch.Generator().manual_seed(0))
    logits = {
        device: transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)(tokens).logits
        for device, folder in exported.items()
    }
    error = (logits["neuron"] - logits["cpu"]).abs().max() / logits["cpu"].abs().max()
    assert error < 1e-5, f"transformers' logits from the two exports differ by {error:.1e}"


@pytest.mark.training
def test_the_census_is_what_the_runs_recorded(runs):
    records = {v: json.loads((runs[v]["census"] / "census.json").read_text()) for v in census.VARIANTS}
    assert census.render(records) == census.DOC.read_text(), (
        "docs/neuron-ops.md is stale: regenerate it with PYTHONPATH=tests:recipes tests/neuron_sim/census.py"
    )
