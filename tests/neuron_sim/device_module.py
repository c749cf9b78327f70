"""`torch.neuron`: the device module the simulated device registers, with what torchtitan and the project call.

Every public function counts its calls by name (`CALLS`), so a test can tell which parts of the device's Python
API a run leaned on. The numbers behind memory and RNG live in the C++ extension (`_ext`, set by `install`).

Device properties: `name` is "trn2" because torchtitan 0.3.0's `get_peak_flops` (written for TorchNeuron by AWS
authors) matches `get_device_properties().name` against "trn2"/"trn3"/"trn1"; a marketing name such as
"Trainium2" would take its unknown-device branch. `get_device_name()` contains "neuron", which is what
`get_peak_flops` tests first. `total_memory` is 24 GiB: a trn2 chip has 96 GiB of HBM shared by 4 logical
NeuronCores at the default LNC=2, and a TorchNeuron process drives one logical core.
"""

import contextlib
import functools
from collections import Counter
from dataclasses import dataclass

import torch

CALLS: Counter = Counter()
_ext = None  # the C++ extension, set by neuron_sim.install()

DEVICE_NAME = "neuron trn2 (simulated)"
TOTAL_MEMORY = 24 * 1024**3


def _counted(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        CALLS[fn.__name__] += 1
        return fn(*args, **kwargs)

    return wrapper


def _index(device=None) -> int:
    """The device index `device` names (None, an int, "neuron", "neuron:1", a torch.device); the current one if it
    names none."""
    if device is None:
        return _ext.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "neuron":
        raise ValueError(f"neuron: expected a neuron device, got {device}")
    return _ext.current_device() if device.index is None else device.index


# ---- devices -------------------------------------------------------------------------------------------------


@_counted
def is_available() -> bool:
    return _ext is not None and _ext.device_count() > 0


@_counted
def is_initialized() -> bool:
    return _ext is not None


@_counted
def init() -> None:
    pass


def _lazy_init() -> None:
    pass


def _is_in_bad_fork() -> bool:
    return False


@_counted
def device_count() -> int:
    return _ext.device_count()


@_counted
def current_device() -> int:
    return _ext.current_device()


@_counted
def set_device(device) -> None:
    _ext.set_device(_index(device))


class device:  # noqa: N801  (the name torch.cuda.device has)
    """Context manager that makes `device` current, as torch.cuda.device."""

    def __init__(self, device):
        self.index = _index(device)
        self.previous = None

    def __enter__(self):
        CALLS["device"] += 1
        self.previous = _ext.current_device()
        _ext.set_device(self.index)
        return self

    def __exit__(self, *exc):
        _ext.set_device(self.previous)
        return False


@_counted
def synchronize(device=None) -> None:
    pass  # every operator has finished when it returns


@_counted
def get_device_name(device=None) -> str:
    return DEVICE_NAME


@dataclass(frozen=True)
class DeviceProperties:
    name: str
    total_memory: int
    type: str = "neuron"
    index: int = 0


@_counted
def get_device_properties(device=None) -> DeviceProperties:
    return DeviceProperties(name="trn2", total_memory=TOTAL_MEMORY, index=_index(device))


@_counted
def get_device_capability(device=None) -> tuple[int, int]:
    return (3, 0)  # NeuronCore-v3


@_counted
def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


@_counted
def get_amp_supported_dtype() -> list[torch.dtype]:
    """torch.autocast(device_type="neuron") asks this (TorchNeuron supports autocast on the device). Activation
    checkpointing's recompute enters autocast for the accelerator even in a CPU run, once `neuron` is one."""
    return [torch.bfloat16, torch.float16, torch.float32]


# ---- memory --------------------------------------------------------------------------------------------------


@_counted
def memory_stats(device=None) -> dict:
    return dict(_ext.memory_stats(_index(device)))


@_counted
def memory_allocated(device=None) -> int:
    return _ext.memory_stats(_index(device))["allocated_bytes.all.current"]


@_counted
def max_memory_allocated(device=None) -> int:
    return _ext.memory_stats(_index(device))["allocated_bytes.all.peak"]


@_counted
def memory_reserved(device=None) -> int:
    return _ext.memory_stats(_index(device))["reserved_bytes.all.current"]


@_counted
def max_memory_reserved(device=None) -> int:
    return _ext.memory_stats(_index(device))["reserved_bytes.all.peak"]


@_counted
def reset_peak_memory_stats(device=None) -> None:
    _ext.reset_peak(_index(device))


@_counted
def reset_max_memory_allocated(device=None) -> None:
    _ext.reset_peak(_index(device))


@_counted
def empty_cache() -> None:
    pass  # no caching allocator: freed blocks go straight back to the host


@_counted
def mem_get_info(device=None) -> tuple[int, int]:
    return TOTAL_MEMORY - memory_allocated(device), TOTAL_MEMORY


# ---- random numbers: seed + offset, 16 bytes, as CUDA's Philox state ----------------------------------------


def _generator(device=None) -> torch.Generator:
    return _ext.default_generator(_index(device))


@_counted
def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


@_counted
def manual_seed_all(seed: int) -> None:
    for i in range(_ext.device_count()):
        _ext.default_generator(i).manual_seed(int(seed))


@_counted
def seed() -> None:
    _generator().seed()


@_counted
def seed_all() -> None:
    value = _generator().seed()
    for i in range(_ext.device_count()):
        _ext.default_generator(i).manual_seed(value)


@_counted
def initial_seed() -> int:
    return _generator().initial_seed()


@_counted
def get_rng_state(device="neuron") -> torch.Tensor:
    """16 uint8 on the host: the seed, then the offset, each a little-endian uint64."""
    return _generator(device).get_state()


@_counted
def set_rng_state(new_state: torch.Tensor, device="neuron") -> None:
    _generator(device).set_state(new_state.detach().to("cpu", torch.uint8).contiguous())


@_counted
def get_rng_state_all() -> list[torch.Tensor]:
    return [_ext.default_generator(i).get_state() for i in range(_ext.device_count())]


@_counted
def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


class _DefaultGenerators:
    def __getitem__(self, index: int) -> torch.Generator:
        return _ext.default_generator(index)

    def __len__(self) -> int:
        return _ext.device_count()

    def __iter__(self):
        return (_ext.default_generator(i) for i in range(_ext.device_count()))


default_generators = _DefaultGenerators()


# ---- streams and events: one stream per device, always idle ------------------------------------------------


class Stream(torch.Stream):
    """torch.Stream on the neuron device; `priority` is accepted and ignored (one stream per device)."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        CALLS["Stream"] += 1
        return super().__new__(cls, device=torch.device("neuron", _index(device)), priority=priority, **kwargs)


class Event(torch.Event):
    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        CALLS["Event"] += 1
        return super().__new__(
            cls, device=torch.device("neuron", _ext.current_device()), enable_timing=enable_timing, blocking=blocking
        )


@_counted
def current_stream(device=None) -> torch.Stream:
    return torch.Stream(device=torch.device("neuron", _index(device)))


@_counted
def default_stream(device=None) -> torch.Stream:
    return torch.Stream(device=torch.device("neuron", _index(device)))


@_counted
def set_stream(stream) -> None:
    pass


@contextlib.contextmanager
def stream(stream=None):
    CALLS["stream"] += 1
    yield stream
