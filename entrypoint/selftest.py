"""The first command on a trn2: `docker run --device=/dev/neuron0 IMAGE --self-test`, one verdict line per check.

    devices      the launcher's own discovery finds Neuron devices (off Neuron: says so, exits 2)
    runtime      torch_neuronx imports and a tensor round-trips through a NeuronCore
    nki_moe      the NKI MoE forward and backward against the PyTorch reference on shapes the kernels take, at
                 LNC 2 and LNC 1 (each in its own process: the runtime reads the LNC once), every error printed
                 against the bf16 tolerance the CPU tests hold the reference to
    native       three `native` smoke steps on one NeuronCore through the launcher, finite losses

The checks that need torch run in children (`python -m neuron_qwen3.selftest`), which print `PASS|FAIL name:
detail` lines. The first failure stops the run with exit status 1; all passed, 0.
"""

import math
import os
import re
import subprocess
import sys

from entrypoint import discovery
from entrypoint.variants import RECIPE_MODULE

OFF_NEURON = 2
LNC_ORDER = (2, 1)  # trn2's default first
LOSS_LINE = r"step:\s*(\d+)\s+loss:\s*(\S+)"  # torchtitan's metrics line, as the launcher's children print it
COLOUR = r"\x1b\[[0-9;]*m"  # the terminal colour codes torchtitan puts in that line: strip them before matching


class Failed(Exception):
    """A check's verdict: failed, with the reason in one line."""


class OffNeuron(Exception):
    """Not a Neuron host: nothing to check."""


def check_devices(settings, root) -> str:
    devices = discovery.discover(settings, root)
    if devices.kind != "neuron":
        raise OffNeuron(f"no Neuron devices here (found {devices.kind}): this is not a Trainium host; run it on a "
                        "trn2 with `docker run --device=/dev/neuron0 ... IMAGE --self-test`")
    return f"{len(devices.nodes)} Neuron devices, {devices.count} logical NeuronCores at LNC {devices.lnc}"


def worker_checks(args, env) -> str:
    """The children's checks: their PASS lines printed as ours; Failed on the first FAIL or a crash."""
    result = subprocess.run([sys.executable, "-m", f"{RECIPE_MODULE}.selftest", *args], env=env,
                            capture_output=True, text=True)
    lines = result.stdout.strip().splitlines()
    for line in lines[:-1]:
        print(f"self-test: {line}", flush=True)
    last = lines[-1] if lines else ""
    if result.returncode or not last.startswith("PASS "):
        tail = last.partition(": ")[2] if last.startswith("FAIL ") else (result.stderr.strip().splitlines()
                                                                          or ["no output"])[-1]
        raise Failed(f"{' '.join(args)} (exit {result.returncode}): {tail}")
    return last.partition(": ")[2]


def kernel_env(environ, lnc: int) -> dict:
    # The compiler's --lnc must equal the runtime's (error NCC_EVRF066); the last --lnc in NEURON_CC_FLAGS wins.
    flags = f"{environ.get('NEURON_CC_FLAGS', '')} --lnc={lnc}".strip()
    return {**environ, "NEURON_LOGICAL_NC_CONFIG": str(lnc), "NEURON_CC_FLAGS": flags, "NEURON_RT_VISIBLE_CORES": "0"}


def losses(output: str) -> dict[int, float]:
    return {int(step): float(loss) for step, loss in re.findall(LOSS_LINE, re.sub(COLOUR, "", output))}


def native_verdict(returncode: int, output: str, steps: int) -> str:
    found = losses(output)
    if returncode or sorted(found) != list(range(1, steps + 1)) or not all(map(math.isfinite, found.values())):
        tail = (output.strip().splitlines() or ["no output"])[-1]
        raise Failed(f"exit {returncode}, losses {found}: {tail}")
    return "losses " + ", ".join(f"{found[step]:.3f}" for step in sorted(found))


def check_native(environ, steps: int = 3) -> str:
    env = {**environ, "VARIANT": "native", "SCALE": "smoke", "STEPS": str(steps), "NPROC": "1",
           "NEURON_RT_VISIBLE_CORES": "0", "OUTPUT_DIR": os.path.join(environ.get("OUTPUT_DIR", "/tmp"), "self-test")}
    result = subprocess.run([sys.executable, "-m", "entrypoint"], env=env, capture_output=True, text=True)
    return native_verdict(result.returncode, result.stdout + result.stderr, steps)


def run_checks(checks) -> int:
    """Run (name, check) pairs in order, one verdict line each; stop at the first failure (exit 1)."""
    for name, check in checks:
        try:
            detail = check()
        except OffNeuron as error:
            print(f"self-test: {error}", flush=True)
            return OFF_NEURON
        except Exception as error:  # a check's own bug is a failure too, in one line
            print(f"self-test: FAIL {name}: {str(error).splitlines()[0] if str(error) else type(error).__name__}",
                  flush=True)
            return 1
        print(f"self-test: PASS {name}: {detail}", flush=True)
    return 0


def run(settings, environ, root="/") -> int:
    return run_checks([("devices", lambda: check_devices(settings, root)),
                       ("runtime", lambda: worker_checks(["runtime"], dict(environ))),
                       *((f"nki_moe LNC {lnc}", lambda lnc=lnc: worker_checks(["kernels", str(lnc)],
                                                                               kernel_env(environ, lnc)))
                         for lnc in LNC_ORDER),
                       ("native", lambda: check_native(environ))])
