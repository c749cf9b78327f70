"""The simulated device's unit checks, run in a fresh interpreter by tests/test_neuron_sim.py.

Installing the device renames PrivateUse1 and makes `neuron` the available device type for the whole process
(torchtitan would pick it at import): the checks run here, in a process that loads it at start-up as every worker
does (NEURON_SIM=1, site/ on PYTHONPATH), not in pytest's own process, and print one JSON
object (`RESULT {...}`) that the tests read. Each check records its outcome or its exception, so one failure
does not hide the others.
"""

import copy
import json
import traceback

import torch

import neuron_sim  # loaded under this name at start-up by site/sitecustomize.py (NEURON_SIM=1), as workers load it
from neuron_sim import build, device_module

CHECKS: dict = {}


def check(name):
    def decorate(fn):
        CHECKS[name] = fn
        return fn

    return decorate


def run() -> dict:
    result = {}
    for name, fn in CHECKS.items():
        try:
            result[name] = fn()
        except Exception as e:  # noqa: BLE001  (recorded for the test to show)
            result[name] = {"error": f"{type(e).__module__}.{type(e).__name__}: {e}"[:2000]}
            result[name]["traceback"] = traceback.format_exc()[-3000:]
    return result


@check("install")
def _install():
    return {
        "installed_at_start": neuron_sim.installed(),
        "build_seconds": build.last_build_seconds,
        "backend_name": torch._C._get_privateuse1_backend_name(),
        "available_device_type": torch._utils._get_available_device_type(),
        "accelerator": str(torch.accelerator.current_accelerator()),
        "device_count": torch.neuron.device_count(),
        "torch_neuron_is_module": torch.neuron is device_module,
    }


@check("round_trip")
def _round_trip():
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool):
        host = (torch.arange(24).reshape(2, 3, 4) % 5).to(dtype)
        on_device = host.to("neuron")
        strided = host.transpose(0, 2).to("neuron:1")
        out[str(dtype)] = {
            "device": str(on_device.device),
            "equal": torch.equal(on_device.cpu(), host),
            "non_contiguous_equal": torch.equal(strided.cpu(), host.transpose(0, 2)),
            "device_to_device_equal": torch.equal(on_device.to("neuron:1").cpu(), host),
            "method_equal": torch.equal(host.neuron().cpu(), host),
        }
    out["is_neuron"] = torch.ones(1).neuron().is_neuron
    out["view_shares_memory"] = _view_shares_memory()
    return out


def _view_shares_memory() -> bool:
    base = torch.zeros(4, 4, device="neuron")
    base.view(16)[3] = 7.0
    base[1].fill_(2.0)
    base.t()[0, 2] = 5.0
    expected = torch.zeros(4, 4)
    expected.view(16)[3] = 7.0
    expected[1].fill_(2.0)
    expected.t()[0, 2] = 5.0
    return torch.equal(base.cpu(), expected)


def _forward_backward(activation) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    device_model = copy.deepcopy(model).to("neuron")
    x = torch.randn(4, 16)
    x_device = x.to("neuron").requires_grad_()
    x.requires_grad_()
    loss = activation(model(x)).square().mean()
    loss.backward()
    device_loss = activation(device_model(x_device)).square().mean()
    device_loss.backward()
    pairs = {
        "loss": (device_loss, loss.detach()),
        "weight_grad": (device_model.weight.grad, model.weight.grad),
        "bias_grad": (device_model.bias.grad, model.bias.grad),
        "input_grad": (x_device.grad, x.grad),
    }
    out = {"loss_device": str(device_loss.device), "grad_device": str(device_model.weight.grad.device)}
    for name, (on_device, host) in pairs.items():
        out[f"{name}_equal"] = torch.equal(on_device.cpu(), host)
        out[f"{name}_max_diff"] = (on_device.cpu() - host).abs().max().item()
    return out


@check("linear")
def _linear():
    return _forward_backward(lambda y: y)


# silu_backward has CPU and CUDA kernels and a CompositeImplicitAutograd decomposition for every other backend:
# on PrivateUse1 the backward runs that decomposition, as it would on TorchNeuron unless it registers a kernel.
@check("linear_silu")
def _linear_silu():
    return _forward_backward(torch.nn.functional.silu)


@check("rng")
def _rng():
    torch.neuron.manual_seed(1234)
    state = torch.neuron.get_rng_state()
    seed, offset = state.view(torch.int64).tolist()
    first = torch.randn(10, device="neuron")
    after = torch.neuron.get_rng_state()
    torch.neuron.set_rng_state(state)
    again = torch.randn(10, device="neuron")
    forked = state.clone()
    forked[8:] = torch.tensor([400], dtype=torch.int64).view(torch.uint8)
    torch.neuron.set_rng_state(forked)
    shifted = torch.randn(10, device="neuron")
    before_fork = torch.neuron.get_rng_state()
    with torch.random.fork_rng(devices=[0], device_type="neuron"):
        torch.randn(5, device="neuron")
    return {
        "dtype": str(state.dtype),
        "numel": state.numel(),
        "device": str(state.device),
        "seed": seed,
        "offset": offset,
        "offset_after_10": after.view(torch.int64).tolist()[1],
        "round_trip_same_numbers": torch.equal(first.cpu(), again.cpu()),
        "other_offset_other_numbers": not torch.equal(first.cpu(), shifted.cpu()),
        "initial_seed": torch.neuron.initial_seed(),
        "fork_rng_restores": torch.equal(torch.neuron.get_rng_state(), before_fork),
        "torch_manual_seed_reaches_device": _torch_manual_seed(),
    }


def _torch_manual_seed() -> bool:
    torch.manual_seed(99)
    return torch.neuron.initial_seed() == 99


@check("device_module")
def _device_module():
    torch.neuron.reset_peak_memory_stats()
    before = torch.neuron.memory_allocated()
    block = torch.empty(1024, 1024, device="neuron")  # 4 MiB
    peak = torch.neuron.max_memory_allocated()
    del block
    properties = torch.neuron.get_device_properties()
    stream = torch.neuron.Stream(priority=-1)
    event = torch.neuron.Event()
    event.record(stream)
    stream.wait_event(event)
    storage = torch.empty(8, device="neuron").untyped_storage()
    storage.resize_(0)
    freed = storage.nbytes()
    storage.resize_(64)
    with torch.autocast("neuron", dtype=torch.bfloat16):  # activation checkpointing's recompute enters it
        ones = torch.ones(2, 2, device="neuron")
        autocast = [str((ones @ ones).dtype), str((ones + ones).dtype)]
    return {
        "autocast": autocast,
        "peak_grew_by": peak - before,
        "after_free": torch.neuron.memory_allocated() - before,
        "stats_keys": sorted(torch.neuron.memory_stats()),
        "name": properties.name,
        "total_memory": properties.total_memory,
        "device_name": torch.neuron.get_device_name(),
        "event_done": event.query(),
        "storage_resized": [freed, storage.nbytes()],
        "calls": dict(device_module.CALLS),
    }


@check("recorder")
def _recorder():
    neuron_sim.reset()
    a = torch.randn(8, 8, device="neuron", dtype=torch.bfloat16)
    with neuron_sim.OpRecorder() as recorder:
        (a @ a).relu().sum().item()
        torch.ones(3).add(1)  # host only: not recorded
    return {
        "mode": {f"{name}|{','.join(dtypes)}": n for (name, dtypes), n in recorder.counts.items()},
        "census": neuron_sim.census(),
    }


def _compile_on_device(fn) -> dict:
    torch._dynamo.reset()
    try:
        torch.compile(fn)(torch.ones(4, 4, device="neuron"))
    except Exception as e:  # noqa: BLE001
        return {"raised": True, "type": f"{type(e).__module__}.{type(e).__name__}", "message": str(e)[:1000]}
    return {"raised": False}


@check("inductor")
def _inductor():
    return _compile_on_device(lambda x: torch.sin(x) * 2)


# A reduction over two dims, as create_block_mask's (torchtitan compiles it): Inductor asks for the device's backend
# features while lowering it, and fails there.
@check("inductor_reduction")
def _inductor_reduction():
    return _compile_on_device(lambda x: (x > 0).sum([-2, -1]))


if __name__ == "__main__":
    print("RESULT " + json.dumps(run(), default=str), flush=True)
