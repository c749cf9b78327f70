"""Shared helpers: where things are, and how to run a Python snippet the way a worker runs."""

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from neuron_qwen3.prelaunch import selftest

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "recipes"
SCENARIOS = Path(__file__).resolve().parent / "scenarios"
# Every child (launcher, torchrun, workers) imports this checkout's code, not whichever checkout the venv's
# editable install points at: a test's result depends on the commit under test.
os.environ["PYTHONPATH"] = os.pathsep.join([str(RECIPES), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])


def worker_env(**extra) -> dict:
    """The environment the launcher gives a smoke worker: offline, unbuffered; without the smoke configs' sample
    prompts, which test_samples.py proves and which would add seconds of generation to every other launch."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", SAMPLE_PROMPTS="")
    env.update(extra)
    return env


def beside(first, second) -> tuple:
    """first() and second() at once: independent launches, much of each imports on one core. Only runs that are
    not timed go two at a time; a stop, whose time to exit is asserted, runs alone."""
    with ThreadPoolExecutor(2) as pool:
        one, other = pool.submit(first), pool.submit(second)
        return one.result(), other.result()


def side_by_side_env(**extra) -> dict:
    """worker_env for a launch that runs beside another: each rank gets its share of half the cores (one thread on
    CI's two). The launcher's default gives a lone rank every core, so two such launches side by side would put
    twice as many threads as cores to work (measured: 9 % slower, bench/RESULTS.md)."""
    threads = max(1, (os.cpu_count() or 1) // (2 * int(extra.get("NPROC", "1"))))
    return worker_env(OMP_NUM_THREADS=str(threads), **extra)


def random_smoke_model(folder, seed: int, moe: bool = False) -> str:
    """A random smoke-shaped Qwen3 (Qwen3-MoE with `moe`) saved by transformers in `folder`: an INIT_FROM for the
    launcher's fine-tuning methods."""
    import torch
    import transformers

    from neuron_qwen3 import config_registry
    from neuron_qwen3.hf import weights

    if moe:
        config = config_registry.nki_moe_qwen3_smoke()
        config.checkpoint.initial_load_in_hf = True
        weights.hf_compatible(config)
        hf = transformers.Qwen3MoeConfig(**weights.native_hf_config(config.model_spec.model, {}))
    else:
        hf = transformers.Qwen3Config(**json.loads((config_registry.HF_MODEL["smoke"] / "config.json").read_text()))
    torch.manual_seed(seed)
    (transformers.Qwen3MoeForCausalLM if moe else transformers.Qwen3ForCausalLM)(hf).save_pretrained(folder)
    return str(folder)


def meta_model(config) -> tuple:
    """(model config, model on the meta device) of `config`, as its trainer builds them: the model config completed
    from the run's, the overrides (the NKI experts) swapped in."""
    import torch
    from torchtitan.config.override import apply_overrides

    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    apply_overrides(config.override, config)
    with torch.device("meta"):
        return model_config, model_config.build()


def folder_tensors(folder) -> dict:
    """Every tensor of a Hugging Face model folder's safetensors files, by name."""
    from safetensors.torch import load_file

    return {
        name: tensor for path in sorted(Path(folder).glob("*.safetensors")) for name, tensor in load_file(path).items()
    }


def rank_logs(output_dir, tail=2000) -> str:
    """The end of every rank's own stderr log (torchrun's --log-dir, OUTPUT_DIR/torchrun): the console shows rank 0
    only, so a failure of another rank is explained here."""
    return "".join(
        f"\n--- {path}\n{path.read_text(errors='replace')[-tail:]}"
        for path in sorted(Path(output_dir, "torchrun").rglob("stderr.log"))
    )


def run_scenario(name: str, *args: str, nproc: int = 1, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run tests/scenarios/<name>.py in a fresh interpreter (patches are process-global)."""
    script = str(SCENARIOS / f"{name}.py")
    if nproc == 1:
        cmd = [sys.executable, script, *args]
    else:
        cmd = [*torchrun(nproc), script, *args]
    return subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=timeout, cwd=REPO)


def scenario_json(name: str, *args: str, timeout: int = 600):
    """run_scenario's last line of output, a scenario's JSON answer; its stderr's tail if it failed."""
    result = run_scenario(name, *args, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def torchrun(nproc: int) -> list:
    """torchrun's command for `nproc` local ranks, its rendezvous on a free local port; the script follows."""
    rendezvous = ["--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0"]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", *rendezvous]


def launcher_errors(tmp_path, timeout: int = 300, **env) -> tuple[int, list]:
    """`python -m entrypoint` at smoke scale with `env` and no other variable: (exit status, stderr lines less
    the warnings)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.environ["PYTHONPATH"],
        "SCALE": "smoke",
        "OUTPUT_DIR": str(tmp_path / "out"),
        "CACHE_DIR": str(tmp_path / "cache"),
        **env,
    }
    result = subprocess.run(
        [sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    return result.returncode, [
        line for line in result.stderr.splitlines() if not line.startswith("entrypoint: warning:")
    ]


def run_scenarios(name: str, *modes: str, nproc: int = 1) -> list:
    """run_scenario(name, mode) for each mode, all at once: independent fresh interpreters, whose imports (most of
    their time, one core each) then share the cores."""
    with ThreadPoolExecutor(len(modes)) as pool:
        return list(pool.map(lambda mode: run_scenario(name, mode, nproc=nproc), modes))


def _transformers_originals() -> list:
    """(class, name, value) of what torchtitan's transformers backend replaces for the whole process each time it
    builds a v5 model (HFTransformerModel._patch_hf_llama_like: PreTrainedModel._init_weights and
    _initialize_weights, the decoder layer's __init__). A model transformers loads later in the same process is
    initialised otherwise (test_finetune's logits moved 6 %, test_validation's loss 2e-4), so a test's result
    would depend on which tests ran before it. Read once, before any test builds anything."""
    from transformers.modeling_utils import PreTrainedModel
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

    return [
        (cls, name, cls.__dict__[name])
        for cls, name in (
            (PreTrainedModel, "_init_weights"),
            (PreTrainedModel, "_initialize_weights"),
            (Qwen3DecoderLayer, "__init__"),
        )
    ]


TRANSFORMERS_ORIGINALS = _transformers_originals()


@pytest.fixture(autouse=True)
def transformers_as_it_was():
    """Every test ends with transformers' classes as they were before it (see _transformers_originals)."""
    yield
    for cls, name, value in TRANSFORMERS_ORIGINALS:
        setattr(cls, name, value)


ANSI = re.compile(selftest.COLOUR)  # torchtitan colours its log lines
STEP_LOSS = re.compile(selftest.LOSS_LINE)  # `step: N  loss: X`, the one pattern the launcher and tests read


def stand_in(tmp_path, package: str, source: str, **env) -> dict:
    """An environment in which `import <package>` loads `source` (a stand-in written under tmp_path), as a child
    process sees it: the stand-in first on PYTHONPATH, then the repository; `env` added."""
    folder = tmp_path / "stand-ins" / package
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(source)
    return {"PYTHONPATH": f"{folder.parent}{os.pathsep}{REPO}", "PATH": os.environ["PATH"], **env}


# `python -m entrypoint ARGS` with discovery and the /dev checks looking under ROOT (a fake /dev), as cli.main's
# `root` parameter allows: the launcher exactly as the container runs it, on any host.
ROOTED = "import sys; from entrypoint import cli; sys.exit(cli.main(sys.argv[2:], root=sys.argv[1]))"


def launcher_at(root, *args) -> list:
    return [sys.executable, "-c", ROOTED, str(root), *args]


def recipes_pass(tmp_path, **env) -> dict:
    """The answer of the recipes' pre-launch pass (neuron_qwen3/prelaunch/preflight.py) to the request the launcher
    makes for
    `env` at smoke scale, computed in this process: the launcher runs the same pass in a child interpreter, whose
    imports take seconds (one line and exit 2 for a problem: test_entrypoint_preflight.py)."""
    from entrypoint import contract, discovery, plan, preflight as launcher_preflight
    from neuron_qwen3.prelaunch import preflight

    environ = {"SCALE": "smoke", "OUTPUT_DIR": str(tmp_path / "out"), "CACHE_DIR": str(tmp_path / "cache"), **env}
    settings = contract.parse(environ)
    resolved = plan.build(settings, discovery.discover(settings, str(tmp_path)), environ)
    return preflight.run(launcher_preflight.request(resolved))


@pytest.fixture(scope="session")
def qwen_size_tokenizer(tmp_path_factory) -> str:
    """The folder of a tokenizer of Qwen's real size (tests/qwen_size.py), built once per session."""
    import qwen_size

    return qwen_size.build(tmp_path_factory.mktemp("qwen-size-tokenizer"))
