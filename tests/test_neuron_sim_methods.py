"""DPO with LoRA, GRPO, EPOCHS over the token cache, and a stop and its resume train on the simulated `neuron`
device (tests/neuron_sim), 2 ranks, as on CPU.

Run: .venv/bin/python -m pytest tests/test_neuron_sim_methods.py -q

The `native` variant through the article's command (census.launch: float32, the same INIT_FROM, both kernels the
references on the device) with each method's flags added. tests/test_neuron_sim_training.py proves plain SFT the
same way; here the methods' own code on the device (the reference model's pass and DPO's loss, adapters sharded
by FSDP, the cache's reader, the save on SIGTERM and DCP's load of it) must give CPU's numbers within 1e-5:

  dpo:    `--preference.method=dpo` on parity pairs, 3 steps at lr 1e-3 (the fine-tuning default, 2e-5, would
          hardly move the adapters), LoRA continued from one PEFT adapter folder on both sides. Not a fresh
          adapter: the device draws A through DTensor's RNG tracker, CPU from a host generator (lora/adapters.py),
          so the two start from different adapters. The folder's B is not zero, so step 1 already computes the
          adapters (the reference is the base).
  grpo:   `--preference.method=grpo` on "Is N even?" prompts, 3 steps of 1 prompt x 4 completions on each rank,
          rewarded for the answer and the first token's parity (tests/test_grpo.py's rewards): the generator's
          prefill and decode with the KV cache on the device, its draws from the host generator (the same on
          both), the rewards, GRPO's loss over two iterations a generation, and the held-out prompts' greedy
          validation. The device's generator reports log-probabilities 0.5 nats off (NEURON_SIM_LOGPROB_OFFSET):
          pi_old is the learner's first pass, so the losses are still CPU's.
  epochs: `--dataloader.epochs=1` over chat records read through `--dataloader.cache_dir`. On CPU once through; on
          the device SIGTERM to torchrun after step 2, then the same command again, which resumes from the stop's
          checkpoint (the only one: the interval is beyond the run).

Seven launches, two at a time: the stopped run and its restart in one chain, the others beside it.
"""

import importlib.util
import json
import random
import re
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import ANSI, REPO, STEP_LOSS, folder_tensors, side_by_side_env
from test_dpo import parity
from test_dpo import write as write_pairs
from test_finetune_variants import save_dense
from test_grpo import REWARDS, questions
from test_neuron_sim import SIM, build_tools  # noqa: F401  (build_tools: the C++ tool check, for this module too)
from test_token_cache import conversation
from test_token_cache import write as write_records

_spec = importlib.util.spec_from_file_location("neuron_sim_census", SIM / "census.py")
census = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(census)

DPO_STEPS, GRPO_STEPS, PAIRS, RECORDS, SIGNAL_AFTER = 3, 3, 40, 30, 2
GENERATOR_OFFSET = 0.5  # nats added to the device's generator's log-probabilities (NEURON_SIM_LOGPROB_OFFSET)
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
NO_SAMPLES = "--samples.prompts="  # off: tests/test_neuron_sim_training.py proves samples on the device
DPO = ["--preference.method=dpo", f"--training.steps={DPO_STEPS}", "--tune.lr=1e-3", "--tune.warmup=0", NO_SAMPLES]
STOPPED_AT = re.compile(r"stop: SIGTERM at step (\d+): saved step-(\d+)")
PLANNED = re.compile(r"epochs: 1 epochs = (\d+) steps")


def metrics(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def adapter(folder, base) -> str:
    """A PEFT adapter folder over `base`, rank 8 on the 7 projections, A and B seeded and not zero."""
    import peft
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=PROJECTIONS))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, value in lora.named_parameters():
            if ".lora_" in name:
                value.copy_(torch.randn(value.shape, generator=generator) * 0.03)
    lora.save_pretrained(folder)
    return str(folder)


def stop_and_resume(output, init_from, env, extra) -> dict:
    """The device's epochs run: SIGTERM to torchrun once step SIGNAL_AFTER's loss is printed, then the same
    command again. What the stop left is kept before the restart writes over the report."""
    line, env = census.command("native", "neuron", output, init_from, env, extra=extra)
    process = subprocess.Popen(line, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, signalled = [], False
    try:
        for text in process.stdout:
            lines.append(text)
            step = STEP_LOSS.search(ANSI.sub("", text))
            if step and int(step[1]) == SIGNAL_AFTER and not signalled:
                process.send_signal(signal.SIGTERM)
                signalled = True
        process.wait(timeout=600)
    finally:
        process.kill()
    output_tail = "".join(lines)[-4000:]
    assert (output / "report" / "summary.json").exists(), f"the stopped run left no report:\n{output_tail}"
    stopped = {
        "output": ANSI.sub("", "".join(lines)),
        "checkpoints": sorted(p.name for p in (output / "checkpoint").iterdir()),
        "metrics": metrics(output / "report" / "metrics.jsonl"),
        "summary": json.loads((output / "report" / "summary.json").read_text()),
    }
    return {"stopped": stopped, "resumed": census.launch("native", "neuron", output, init_from, env, extra=extra)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("sim_methods")
    save_dense(root / "dense")
    rng = random.Random(0)
    pairs = write_pairs(root / "pairs.jsonl", [parity(rng.randrange(10)) for _ in range(PAIRS)])
    chat = write_records(root / "chat.jsonl", [conversation(i) for i in range(RECORDS)])
    dpo = [
        *DPO,
        f"--dataloader.source={pairs}",
        f"--checkpoint.initial_load_path={adapter(root / 'adapter', root / 'dense')}",
    ]
    (root / "parity").mkdir()
    prompts = [
        {"prompt": [m], "answer": "Yes." if int(m["content"].split()[1]) % 2 == 0 else "No."} for m in questions(80)
    ]
    (root / "parity" / "parity.jsonl").write_text("".join(json.dumps(record) + "\n" for record in prompts))
    (root / "parity" / "parity_rewards.py").write_text(REWARDS)
    grpo = [
        "--preference.method=grpo",
        "--grpo.rewards=parity_rewards:correct,parity_rewards:odd_start",
        "--grpo.generations=4",
        "--grpo.max_completion=12",
        "--grpo.iterations=2",
        "--training.global_batch_size=8",
        "--training.seq_len=64",
        f"--training.steps={GRPO_STEPS}",
        "--tune.lr=1e-2",
        "--tune.warmup=0",
        f"--dataloader.source={root / 'parity' / 'parity.jsonl'}",
        NO_SAMPLES,
    ]
    epochs = [
        "--dataloader.epochs=1",
        f"--dataloader.source={chat}",
        "--dataloader.field=messages",
        f"--dataloader.cache_dir={root / 'tokens'}",
        "--checkpoint.interval=100",
        NO_SAMPLES,
    ]
    env = side_by_side_env()
    found = {"root": root}

    def launch(name, device, extra, offset=None):
        run_env = env | ({"NEURON_SIM_LOGPROB_OFFSET": str(offset)} if offset else {})
        done = census.launch("native", device, root / name, root / "dense", run_env, extra=extra)
        assert done.returncode == 0, f"{name}:\n{done.stderr[-4000:]}"
        return name, done

    others = [("dpo-cpu", "cpu", dpo), ("dpo-neuron", "neuron", dpo), ("epochs-cpu", "cpu", epochs)]
    others += [("grpo-cpu", "cpu", grpo), ("grpo-neuron", "neuron", grpo, GENERATOR_OFFSET)]
    with ThreadPoolExecutor(2) as pool:  # two launches at a time
        chain = pool.submit(stop_and_resume, root / "epochs-neuron", root / "dense", env, epochs)
        found.update(future.result() for future in [pool.submit(launch, *other) for other in others])
        found.update(chain.result())
    return found


def assert_same_numbers(on_cpu: list, on_neuron: list) -> None:
    """Each step's loss and grad norm and each validation loss within 1e-5 relative, record for record."""
    assert [(r["step"], "loss" in r) for r in on_neuron] == [(r["step"], "loss" in r) for r in on_cpu]
    for cpu, neuron in zip(on_cpu, on_neuron):
        for name in ("loss", "grad_norm", "validation_loss"):
            if name in cpu:
                assert neuron[name] == pytest.approx(cpu[name], rel=1e-5), (name, cpu["step"])


@pytest.mark.training
def test_dpo_with_lora_trains_on_neuron_as_on_cpu(runs):
    on_cpu, on_neuron = (metrics(runs["root"] / f"dpo-{d}" / "report" / "metrics.jsonl") for d in ("cpu", "neuron"))
    assert [r["step"] for r in on_neuron if "loss" in r] == list(range(1, DPO_STEPS + 1))
    assert_same_numbers(on_cpu, on_neuron)
    for cpu, neuron in zip(on_cpu, on_neuron):  # the policy's and the reference's log-probabilities of the pairs
        assert neuron["dpo"]["pairs"] == cpu["dpo"]["pairs"] > 0
        for name in ("logps/chosen", "logps/rejected"):
            assert neuron["dpo"][name] == pytest.approx(cpu["dpo"][name], rel=1e-5), (name, cpu["step"])
    losses = [r["loss"] for r in on_neuron if "loss" in r]
    assert abs(losses[0] - 0.6931472) > 1e-4, "step 1 is not log 2: the adapters differ from the reference"
    assert len(set(losses)) == DPO_STEPS, "the steps trained"
    log = runs["dpo-neuron"].stdout + runs["dpo-neuron"].stderr
    assert "LoRA: continuing the adapter of" in log and "reference the base model (LoRA adapters off)" in log


@pytest.mark.training
def test_grpo_generates_and_trains_on_neuron_as_on_cpu(runs):
    """Two iterations a generation, the device's generator's log-probabilities GENERATOR_OFFSET off (as a trn2's
    sampler kernels are not its learner's): the same completions (their rewards and lengths exactly), the same GRPO
    figures within 1e-5 (clipping, entropy), the same losses and gradient norms, and the same validation (greedy
    answers to the held-out prompts, scored), step for step. pi_old is the learner's, so the offset shows only in
    the sampler's difference: about 0 on CPU, the offset on the device."""
    on_cpu, on_neuron = (metrics(runs["root"] / f"grpo-{d}" / "report" / "metrics.jsonl") for d in ("cpu", "neuron"))
    assert [r["step"] for r in on_neuron if "loss" in r] == list(range(1, GRPO_STEPS + 1))
    assert_same_numbers(on_cpu, on_neuron)
    trained = [(cpu, neuron) for cpu, neuron in zip(on_cpu, on_neuron) if "loss" in cpu]
    assert ["reward/mean" in cpu["grpo"] for cpu, _ in trained] == [True, False, True], "a generation every 2 steps"
    for cpu, neuron in trained:
        assert neuron["grpo"].keys() == cpu["grpo"].keys(), cpu["step"]
        generated = "reward/mean" in cpu["grpo"]
        for name, value in cpu["grpo"].items():
            if name.startswith("time/"):
                continue
            if name.startswith("sampling/logp_difference"):  # |the learner's - the sampler's| of each token
                if generated:  # the first pass: the learner's is the sampler's policy, off by the offset alone
                    assert value < 1e-5, name
                    assert neuron["grpo"][name] == pytest.approx(GENERATOR_OFFSET, abs=1e-5), name
                continue
            exact = name.startswith(("reward", "completions/", "frac_reward_zero_std"))
            assert neuron["grpo"][name] == (value if exact else pytest.approx(value, rel=1e-5, abs=1e-7)), name
    assert any(r["grpo"]["clip_ratio/region_mean"] > 0 for r in on_neuron if "loss" in r), "no iteration clipped"
    flat = [cpu["grpo"]["frac_reward_zero_std"] for cpu, _ in trained if "reward/mean" in cpu["grpo"]]
    assert min(flat) < 1, "no group's rewards vary: every advantage is 0"
    assert any("validation_loss" in r for r in on_neuron), "the held-out prompts were generated and scored"
    log = runs["grpo-neuron"].stdout + runs["grpo-neuron"].stderr
    assert "grpo: dapo loss" in log


@pytest.mark.training
def test_the_devices_adapter_export_is_the_cpus(runs):
    """The exported PEFT adapters agree to 1 % of what the 3 steps changed, tensor by tensor (Frobenius norms).
    Measured: 2.1e-4 at most, 9e-4 from another adapter: AdamW's update is about lr wherever a gradient is not ~0,
    so a near-zero gradient's last digits move its update that much (as in test_neuron_sim_training's exports).
    A wrong export (a transposed, missing or untrained tensor) is of the order of 1."""
    root = runs["root"]
    initial, cpu, neuron = (folder_tensors(root / name) for name in ("adapter", "dpo-cpu/export", "dpo-neuron/export"))
    assert cpu.keys() == neuron.keys() == initial.keys() and len(cpu) == 2 * 2 * len(PROJECTIONS)
    for name, tensor in cpu.items():
        assert neuron[name].dtype == torch.float32
        ratio = (neuron[name] - tensor).norm() / (tensor - initial[name]).norm()
        assert ratio < 1e-2, (name, ratio.item())


@pytest.mark.training
def test_sigterm_on_neuron_saves_the_step_and_ends_the_run_stopped(runs):
    stopped = runs["stopped"]
    stop = STOPPED_AT.search(stopped["output"])
    assert stop and stop[1] == stop[2], stopped["output"][-4000:]
    k = int(stop[1])
    assert stopped["checkpoints"] == [f"step-{k}"], "the stop's save, and no other (the interval is 100)"
    assert [r["step"] for r in stopped["metrics"] if "loss" in r] == list(range(1, k + 1))
    assert stopped["summary"]["end"] == "stopped" and stopped["summary"]["steps"]["done"] == k, stopped["summary"]


@pytest.mark.training
def test_the_resumed_epochs_run_is_the_uninterrupted_cpu_run(runs):
    """The stopped run's steps, then the restart's, equal CPU's run through the epoch step for step; each plans the
    epoch's steps from the token cache, and the restart finds it built."""
    root, stopped, resumed = runs["root"], runs["stopped"], runs["resumed"]
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    logs = {
        "cpu": ANSI.sub("", runs["epochs-cpu"].stdout + runs["epochs-cpu"].stderr),
        "stopped": stopped["output"],
        "resumed": ANSI.sub("", resumed.stdout + resumed.stderr),
    }
    planned = {name: {int(n) for n in PLANNED.findall(log)} for name, log in logs.items()}
    steps = max(planned["cpu"], default=0)
    assert planned == dict.fromkeys(logs, {steps}) and steps > SIGNAL_AFTER + 1, planned
    assert all("token cache: " in log for log in logs.values()), "the epoch planned from the cache"
    assert "token cache: found" in logs["resumed"]
    k = int(STOPPED_AT.search(stopped["output"])[1])
    assert k < steps and f"Training starts at step {k + 1}" in logs["resumed"]
    on_cpu = metrics(root / "epochs-cpu" / "report" / "metrics.jsonl")
    again = metrics(root / "epochs-neuron" / "report" / "metrics.jsonl")
    on_neuron = [r for r in stopped["metrics"] if r["step"] <= k] + [r for r in again if r["step"] > k]
    assert [r["step"] for r in on_cpu if "loss" in r] == list(range(1, steps + 1))
    assert_same_numbers(on_cpu, on_neuron)
    assert sum("validation_loss" in r for r in on_neuron) >= 2
    summary = json.loads((root / "epochs-neuron" / "report" / "summary.json").read_text())
    assert summary["end"] == "finished" and summary["steps"] == {"done": steps, "planned": steps}, summary
