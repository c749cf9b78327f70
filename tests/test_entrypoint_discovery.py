"""Device discovery on fake /dev trees (plain files stand in for device nodes) and injected neuron-ls output.

Run: .venv/bin/python -m pytest tests/test_entrypoint_discovery.py -q
"""

import json
import os

import pytest

from entrypoint import contract, discovery, values

PER_DEVICE = discovery.PHYSICAL_CORES_PER_DEVICE


def tree(root, *names):
    (root / "dev").mkdir(exist_ok=True)
    for name in names:
        (root / "dev" / name).touch()
    return root


def discover(root, neuron_ls=lambda: pytest.fail("neuron-ls consulted for a fake root"), **env):
    return discovery.discover(contract.parse(env), str(root), neuron_ls)


def neurons(n):
    return [f"neuron{i}" for i in range(n)]


@pytest.mark.parametrize("devices", [1, 16])
@pytest.mark.parametrize("lnc", [1, 2])
def test_neuron_cores_are_devices_times_logical_cores(tmp_path, devices, lnc):
    found = discover(tree(tmp_path, *neurons(devices)), NEURON_LOGICAL_NC_CONFIG=str(lnc))
    assert (found.kind, found.count, found.lnc) == ("neuron", devices * PER_DEVICE // lnc, lnc)
    assert found.nodes == tuple(neurons(devices))


@pytest.mark.parametrize("visible, count", [("3", 1), ("0-3", 4), ("0-3,8", 5), ("0,2,4-7", 6), ("63", 1)])
def test_visible_cores_limit_the_count(tmp_path, visible, count):
    found = discover(tree(tmp_path, *neurons(16)), NEURON_RT_VISIBLE_CORES=visible)
    assert found.count == count
    assert found.visible_cores == values.core_list(visible)


@pytest.mark.parametrize(
    "devices, lnc, visible, bad",
    [(1, "2", "4", 4), (1, "2", "0-3,9", 9), (16, "2", "64", 64), (16, "1", "120-128", 128)],
)
def test_visible_core_that_does_not_exist_is_refused(tmp_path, devices, lnc, visible, bad):
    with pytest.raises(contract.UsageError, match=f"core {bad}, .* cores 0-{devices * PER_DEVICE // int(lnc) - 1}"):
        discover(tree(tmp_path, *neurons(devices)), NEURON_LOGICAL_NC_CONFIG=lnc, NEURON_RT_VISIBLE_CORES=visible)


@pytest.mark.parametrize(
    "names, gap", [(["neuron0", "neuron1", "neuron3"], 2), (["neuron1"], 0), (["neuron0", "neuron10"], 1)]
)
def test_device_numbering_must_be_contiguous_from_zero(tmp_path, names, gap):
    with pytest.raises(contract.UsageError, match=f"/dev/neuron{gap} is missing.*contiguous") as error:
        discover(tree(tmp_path, *names))
    assert "\n" not in str(error.value)


def listing(devices, per_device):
    return [
        {
            "neuron_device": d,
            "nc_count": per_device,
            "logical_neuroncore_config": 2,
            "neuroncore_ids": list(range(d * per_device, (d + 1) * per_device)),
            "neuron_processes": [],
        }
        for d in range(devices)
    ]


def test_neuron_ls_is_preferred_on_the_real_root():
    found = discover("/", neuron_ls=lambda: listing(16, 4))
    assert (found.kind, found.count, len(found.nodes)) == ("neuron", 64, 16)
    found = discover("/", neuron_ls=lambda: listing(2, 4), NEURON_RT_VISIBLE_CORES="4-7")
    assert (found.count, found.visible_cores) == (4, (4, 5, 6, 7))
    with pytest.raises(contract.UsageError, match="core 8"):
        discover("/", neuron_ls=lambda: listing(2, 4), NEURON_RT_VISIBLE_CORES="8")


def test_run_neuron_ls_without_the_tool(monkeypatch):
    monkeypatch.setenv("PATH", "")
    assert discovery.run_neuron_ls() is None


@pytest.mark.parametrize(
    "output, expected",
    [
        (
            json.dumps(listing(2, 4)),
            [
                {"neuron_device": 0, "nc_count": 4, "processes": []},
                {"neuron_device": 1, "nc_count": 4, "processes": []},
            ],
        ),
        (
            json.dumps([{**listing(1, 4)[0], "neuron_processes": [{"pid": 42, "command": "python", "x": 1}]}]),
            [{"neuron_device": 0, "nc_count": 4, "processes": [(42, "python")]}],
        ),
        ('{"error": "no devices"}', None),
        ("[1]", None),
        ("not json", None),
    ],
)
def test_neuron_ls_output(tmp_path, monkeypatch, output, expected):
    (tmp_path / "out.json").write_text(output)
    fake = tmp_path / "neuron-ls"
    fake.write_text(f"#!/bin/sh\ncat {tmp_path / 'out.json'}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert discovery.run_neuron_ls() == expected


@pytest.mark.parametrize("visible, count", [(None, 4), ("1", 1), ("0,3", 2), ("0,7,1", 1), ("GPU-abc,1", 2)])
def test_cuda_devices(tmp_path, visible, count):
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    found = discover(tree(tmp_path, "nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"), **env)
    assert (found.kind, found.count, len(found.nodes)) == ("cuda", count, 4)


def test_cuda_hidden_or_absent_falls_back_to_cpu(tmp_path):
    (tmp_path / "hidden").mkdir()
    assert discover(tree(tmp_path / "hidden", "nvidia0"), CUDA_VISIBLE_DEVICES="").kind == "cpu"
    assert discover(tree(tmp_path, "nvidiactl", "null")) == discovery.Devices("cpu", os.cpu_count())
    assert discover(tmp_path / "no-such-root").kind == "cpu"


def test_neuron_wins_over_cuda(tmp_path):
    assert discover(tree(tmp_path, "nvidia0", "neuron0")).kind == "neuron"
