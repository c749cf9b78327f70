"""The generator (neuron_qwen3/generate/) against transformers, in process, for each variant's model.

Each model is built from the recipes' smoke config and loaded, through its state-dict adapter, from a random model
transformers made and saved (test_finetune_variants' helpers), in float32. Greedy answers must be transformers'
`generate` on the same weights token for token, for prompts of several lengths in several waves and buckets,
with early stops; the generator must run only the shapes its plan announced; the log-probability it records for
each sampled token must be the training forward's on the finished sequence. Two FSDP ranks with prompts of their
own run as a torchrun scenario (scenarios/generate_ranks.py); the 2-rank runs through the launcher are
test_samples.py's. The offline command's answers: from an exported folder, and from a checkpoint (two launcher
runs save steps 2 and 4; the command exports each through the launcher), a LoRA run's checkpoint merged; what it
refuses in one line.
Run: .venv/bin/python -m pytest tests/test_generate.py -q
"""

import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, beside, folder_tensors, random_smoke_model, run_scenario, worker_env
from test_finetune_variants import moe_config, save_dense, save_moe, tensors

from neuron_qwen3.generate.engine import Generator
from neuron_qwen3.generate.plan import QUERY_BLOCK, Plan, buckets_for
from neuron_qwen3.generate.sampling import Sampling

NEW_TOKENS = 12
LENGTHS = (5, 19, 3, 33, 9)  # three buckets (16, 32, 64), waves of 2 slots: 3 waves, the last one half empty


def prompts(vocab: int, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in LENGTHS]


@functools.cache
def built(variant: str, folder: str):
    """(our model, transformers' model), the same weights, float32, eval."""
    from torchtitan.config.override import apply_overrides

    from neuron_qwen3 import config_registry, finish
    from neuron_qwen3.quirks import hf_rope_fix

    if variant == "transformers":  # the offline command's model: transformers' own, through the same generator
        reference = save_dense(folder)
        return reference.eval(), reference
    if variant == "nki_moe":
        reference = save_moe(folder)
        config = moe_config()
        config.training.mixed_precision_param = "float32"
        finish.cpu_float32(config, "cpu")  # the experts compute in float32, as transformers' do
    else:
        reference = save_dense(folder)
        if variant == "v5":
            hf_rope_fix.apply()
        config = getattr(config_registry, f"{variant}_qwen3_smoke")()
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    apply_overrides(config.override, config)
    if variant == "v5":
        with torch.device("meta"):
            model = model_config.build()
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_weights(buffer_device=None)
    else:
        model = model_config.build()
    model.load_state_dict(config.model_spec.state_dict_adapter(model_config, None).from_hf(tensors(folder)))
    return model.eval(), reference.eval()


@pytest.fixture(scope="module", params=["native", "nki_moe", "v5", "transformers"])
def models(request, tmp_path_factory):
    return built(request.param, str(tmp_path_factory.mktemp(request.param)))


def transformers_greedy(reference, ids: list, stops: set, new_tokens: int = NEW_TOKENS) -> tuple[list, list]:
    """transformers' greedy answer to one prompt: (tokens, the log-probability of each under its logits)."""
    out = reference.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=sorted(stops) or None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    tokens = out.sequences[0, len(ids) :].tolist()
    logprobs = [step[0].float().log_softmax(-1)[token].item() for step, token in zip(out.logits, tokens)]
    return tokens, logprobs


@pytest.mark.parametrize("query_block", [QUERY_BLOCK, 5])
def test_greedy_answers_are_transformers_generate(models, query_block):
    """Also with the prefill's queries scored 5 at a time: blocks that end inside a bucket, and an uneven last one."""
    model, reference = models
    asked = prompts(reference.config.vocab_size)
    free = [transformers_greedy(reference, ids, set())[0] for ids in asked]
    # stop tokens that end two of the answers early, at different steps; the others run to the budget
    stops = {free[0][3], free[3][7]} - set(free[1] + free[2] + free[4])
    plan = Plan(slots=2, buckets=buckets_for(list(LENGTHS), room=64), new_tokens=NEW_TOKENS, query_block=query_block)
    assert plan.buckets == (16, 32, 64)
    answers = Generator(model, plan, stops).generate(asked, Sampling())
    expected = [transformers_greedy(reference, ids, stops) for ids in asked]
    assert [a.tokens for a in answers] == [tokens for tokens, _ in expected]
    for answer, (_, logprobs) in zip(answers, expected):
        torch.testing.assert_close(torch.tensor(answer.logprobs), torch.tensor(logprobs), rtol=0, atol=1e-5)
    assert [a.stop for a in answers] == ["end" if t[-1] in stops else "length" for t, _ in expected]
    assert sum(len(t) < NEW_TOKENS for t, _ in expected) == 2  # two early stops were exercised


def test_only_the_announced_shapes_run(models):
    """A hook on the model's forward records every input shape, over two rounds with other prompts (on a
    transformers model, its decoder's: the generator applies the lm_head itself)."""
    model, reference = models
    plan = Plan(slots=2, buckets=(16, 32, 64), new_tokens=NEW_TOKENS)
    generator = Generator(model, plan, stops=set())
    seen = set()

    def record(module, args, kwargs):
        seen.add(tuple((args[0] if args else kwargs["input_ids"]).shape))

    decoder = model.model if generator.kind == "hf" else model
    handle = decoder.register_forward_pre_hook(record, with_kwargs=True)
    try:
        generator.generate(prompts(reference.config.vocab_size, seed=1), Sampling())
        generator.generate(prompts(reference.config.vocab_size, seed=2)[:3], Sampling())
    finally:
        handle.remove()
    announced = {shape for _, shape in plan.shapes()}
    assert seen == announced
    assert {shape for _, shape in generator.forwards} == announced


def test_sampled_logprobs_are_the_training_forwards(models):
    model, reference = models
    asked = prompts(reference.config.vocab_size)
    plan = Plan(slots=3, buckets=(16, 64), new_tokens=NEW_TOKENS)
    sampling = Sampling(temperature=1.0, top_k=50, top_p=0.95)
    answers = Generator(model, plan, stops=set()).generate(asked, sampling, torch.Generator().manual_seed(0))
    for ids, answer in zip(asked, answers):
        sequence = torch.tensor([ids + answer.tokens])
        with torch.no_grad():
            logits = reference(sequence).logits[0, len(ids) - 1 : -1].float()
        expected = logits.log_softmax(-1).gather(-1, torch.tensor(answer.tokens)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(answer.logprobs), expected, rtol=0, atol=1e-5)


def test_a_seeded_round_is_drawn_again_from_the_saved_generator_state(models):
    model, reference = models
    asked = prompts(reference.config.vocab_size)[:2]
    generator = Generator(model, Plan(slots=2, buckets=(64,), new_tokens=NEW_TOKENS), stops=set())
    sampling = Sampling(temperature=1.0)
    rng = torch.Generator().manual_seed(7)
    state = rng.get_state()
    first = generator.generate(asked, sampling, rng)
    rng.set_state(state)  # what a resume restores
    again = generator.generate(asked, sampling, rng)
    assert [a.tokens for a in first] == [a.tokens for a in again]
    assert first[0].tokens != generator.generate(asked, sampling, rng)[0].tokens  # the draws do move on


def test_ranks_answering_different_prompts_each_get_transformers_answers(tmp_path):
    """Two ranks under FSDP answer prompts of their own, as GRPO's ranks and its held-out validation do: rank 0
    three waves and rank 1 one, whose answer stops early; then rank 0 one prompt and rank 1 none. Every forward
    gathers the weights from both ranks, so a rank that ran fewer would hang its peer: each answer must still be
    transformers' greedy one, with the weights gathered at every forward pass and gathered once a round. Gathered
    once, a round all-gathers each unit once; after it every weight is sharded again and each unit frees its
    weights after a forward pass as torchtitan chose (the blocks do, the root does not)."""
    reference = save_dense(tmp_path / "model").eval()
    vocab = reference.config.vocab_size
    rounds = {"0": [prompts(vocab), prompts(vocab, seed=1)[:1]], "1": [prompts(vocab, seed=2)[1:2], []]}
    free = [transformers_greedy(reference, ids, set())[0] for ids in rounds["1"][0] + rounds["0"][0]]
    stops = {free[0][2]} - {token for answer in free[1:] for token in answer}  # rank 1's answer ends early
    plan = {"slots": 2, "buckets": [16, 32, 64], "new_tokens": NEW_TOKENS}
    (tmp_path / "asked.json").write_text(json.dumps({"plan": plan, "stops": sorted(stops), **rounds}))
    result = run_scenario(
        "generate_ranks", str(tmp_path / "model"), str(tmp_path / "asked.json"), str(tmp_path), nproc=2
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    found = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in rounds}
    for rank, asked in rounds.items():
        expected = [[transformers_greedy(reference, ids, stops)[0] for ids in each] for each in asked]
        each, once, units, blocks = (found[rank][k] for k in ("each_forward", "once", "units", "blocks"))
        assert each["answers"] == once["answers"] == expected, rank
        assert units == blocks + 1  # the blocks and the root
        assert once["gathers"] == units * len(asked), rank
        # the root, resharded after the gathered rounds, is gathered once and kept
        assert each["gathers"] == blocks * each["forwards"] + 1, rank
        for way in (each, once):
            assert way["blocks_sharded"] and way["choices_after"] == [False] + [True] * blocks, rank
        assert once["all_sharded"] and not each["all_sharded"], rank  # the root's gathered weights kept, or freed
    # rank 1's answer stopped early while rank 0's ran on to the budget: rank 1 kept pace with masked slots
    answers = {rank: found[rank]["once"]["answers"] for rank in rounds}
    assert len(answers["1"][0][0]) < NEW_TOKENS and max(map(len, answers["0"][0])) == NEW_TOKENS
    assert found["0"]["once"]["forwards"] == found["1"]["once"]["forwards"] == found["0"]["each_forward"]["forwards"]


def test_the_offline_command_answers_a_prompts_file_as_transformers_does(tmp_path):
    """An exported folder (weights, config.json, the bundled tokenizer) and the bundled prompts: each answer in
    the JSONL is transformers' greedy answer to the prompt as its chat template renders it."""
    import transformers

    from neuron_qwen3 import config_registry
    from neuron_qwen3.generate import setup as generator_setup

    folder = tmp_path / "export"
    reference = save_dense(folder).eval()
    for path in config_registry.SMOKE_TOKENIZER.iterdir():
        shutil.copyfile(path, folder / path.name)
    out = tmp_path / "answers.jsonl"
    command = [sys.executable, "-m", "neuron_qwen3.generate", str(folder), str(config_registry.SMOKE_PROMPTS)]
    result = subprocess.run(
        [*command, "--out", str(out), "--tokens", "10", "--slots", "2"],
        env=worker_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    records = [json.loads(line) for line in config_registry.SMOKE_PROMPTS.read_text().splitlines()]
    assert [row["prompt"] for row in rows] == [f"{config_registry.SMOKE_PROMPTS}:{k}" for k in range(1, 4)]
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    stops = generator_setup.stop_ids(generator_setup.tokenizer_of(config_registry.native_qwen3_smoke()))
    for row, record in zip(rows, records):
        messages = record.get("messages") or [{"role": "user", "content": record["prompt"]}]
        options = {} if record.get("enable_thinking") is None else {"enable_thinking": record["enable_thinking"]}
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False, **options)
        expected, logprobs = transformers_greedy(reference, ids, stops, new_tokens=10)
        assert row["tokens"] == expected and row["answer"] == tokenizer.decode(expected)
        assert row["stop"] == ("end" if expected[-1] in stops else "length")
        torch.testing.assert_close(torch.tensor(row["logprobs"]), torch.tensor(logprobs), rtol=0, atol=1e-5)
    assert "prefill shape [2, 32]" in result.stderr or "prefill shape [2, 64]" in result.stderr


def test_the_offline_command_refuses_bad_input_in_one_line(tmp_path):
    command = [sys.executable, "-m", "neuron_qwen3.generate", str(tmp_path), str(tmp_path / "none.jsonl")]
    result = subprocess.run(
        [*command, "--out", str(tmp_path / "o.jsonl"), "--top-p", "1.5"],
        env=worker_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "top_p=1.5" in result.stderr


def launch(tmp_path, **env):
    """The launcher at smoke scale (native, random init, offline, no samples), checkpoints in
    tmp_path/checkpoint."""
    env = worker_env(
        SCALE="smoke", CHECKPOINT_DIR=str(tmp_path / "checkpoint"), CACHE_DIR=str(tmp_path / "cache"), **env
    )
    result = subprocess.run(
        [sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


def offline(tmp_path, model, name, *args, **env):
    """The offline command on `model` with the bundled prompts, in the launches' environment: (its result, its
    answers)."""
    from neuron_qwen3 import config_registry

    out = tmp_path / f"{name}.jsonl"
    command = [sys.executable, "-m", "neuron_qwen3.generate", str(model), str(config_registry.SMOKE_PROMPTS)]
    env = worker_env(SCALE="smoke", CACHE_DIR=str(tmp_path / "cache"), **env)
    result = subprocess.run(
        [*command, "--out", str(out), "--tokens", "10", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return result, out.read_text() if out.exists() else None


def test_a_checkpoint_is_answered_as_its_step_exported(tmp_path, capsys):
    """A checkpoint is exported by the launcher, in the run's environment, at the step asked for: a step-N folder
    that is not the newest, or the folder of them (its newest). Its answers are those of the folder the run
    exported at that step, and its --export-dir holds the same tensors. In another variant's environment the
    export fails in one line; a PEFT adapter folder and a folder of neither are refused in one line each."""
    from neuron_qwen3.generate.__main__ import main

    launch(tmp_path, STEPS="2", OUTPUT_DIR=str(tmp_path / "run"), EXPORT_DIR=str(tmp_path / "at-2"))
    on = launch(tmp_path, STEPS="4", OUTPUT_DIR=str(tmp_path / "run-on"), EXPORT_DIR=str(tmp_path / "at-4"))
    assert "checkpoints: resuming from step 2" in on.stdout + on.stderr
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == ["step-2", "step-4"]

    # two lanes at once, each mostly imports on one core: the exported folders, and the checkpoint's three exports,
    # one after another (each holds CHECKPOINT_DIR's lease while it exports)
    def folders():
        return {step: offline(tmp_path, tmp_path / f"at-{step}", f"at-{step}") for step in (2, 4)}

    def exports():
        return {
            "from-2": offline(tmp_path, tmp_path / "checkpoint" / "step-2", "from-2", "--export-dir", tmp_path / "x-2"),
            "from-newest": offline(tmp_path, tmp_path / "checkpoint", "from-newest", EPOCHS="1"),  # an EPOCHS run's
            "as-v5": offline(tmp_path, tmp_path / "checkpoint", "as-v5", VARIANT="v5"),
        }

    exported_folders, checkpoint_exports = beside(folders, exports)
    answers = {**exported_folders, **checkpoint_exports}
    assert all(answers[step][0].returncode == 0 for step in (2, 4))
    assert answers[2][1] != answers[4][1]  # two steps of training changed the answers' tokens or log-probabilities

    result, found = answers["from-2"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "checkpoints: resuming from step 2" in result.stderr and found == answers[2][1]
    exported, trained = folder_tensors(tmp_path / "x-2"), folder_tensors(tmp_path / "at-2")
    assert exported.keys() == trained.keys() and all(torch.equal(exported[k], trained[k]) for k in trained)
    result, found = answers["from-newest"]
    assert result.returncode == 0 and found == answers[4][1], result.stderr[-3000:]

    result, found = answers["as-v5"]
    assert result.returncode == 2 and found is None
    assert result.stderr.splitlines()[-1] == (
        f"neuron_qwen3.generate: {tmp_path}/checkpoint/step-4: the launcher's export of the checkpoint failed "
        "(exit 1, its output above): run this command in the environment of the run that saved it"
    )

    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    prompts = str(tmp_path / "prompts.jsonl")
    Path(prompts).write_text("")
    expected = {
        tmp_path / "adapter": "a PEFT adapter folder, not a model folder: export the run with EXPORT_MERGED=1",
        tmp_path / "run": "neither an exported model folder (no config.json) nor a checkpoint (no step-N)",
        tmp_path / "step-7": "not a complete checkpoint: no .metadata: the save did not finish",
    }
    (tmp_path / "step-7").mkdir()
    for folder, says in expected.items():
        assert main([str(folder), prompts, "--out", str(tmp_path / "answers.jsonl")]) == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"neuron_qwen3.generate: {folder}: {says}"), lines
    assert not (tmp_path / "answers.jsonl").exists()


def test_a_lora_checkpoint_is_answered_as_the_runs_merged_export(tmp_path):
    """A LoRA checkpoint holds the adapters alone: the launcher's export in the run's environment (INIT_FROM, LoRA)
    merges them into the base, so the answers are those of the merged model the run exported at its end."""
    lora = dict(INIT_FROM=random_smoke_model(tmp_path / "base", seed=1), LORA_RANK="8")
    launch(
        tmp_path,
        STEPS="2",
        OUTPUT_DIR=str(tmp_path / "run"),
        EXPORT_DIR=str(tmp_path / "end"),
        EXPORT_MERGED="1",
        **lora,
    )
    (ended, found), (result, from_checkpoint) = beside(  # independent: the exported folder, the checkpoint's export
        lambda: offline(tmp_path, tmp_path / "end", "end"),
        lambda: offline(tmp_path, tmp_path / "checkpoint", "from-checkpoint", **lora),
    )
    assert ended.returncode == result.returncode == 0, result.stderr[-3000:]
    assert from_checkpoint == found
