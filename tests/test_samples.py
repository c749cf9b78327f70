"""Generation samples while it trains (report/samples.py), proven against transformers' greedy `generate`.

In process: the prompt ids are transformers' `apply_chat_template(..., add_generation_prompt=True,
enable_thinking=...)`; a bad SAMPLE_PROMPTS record is one line naming its line. The generator itself against
transformers' `generate`, in process: tests/test_generate.py.

Through the launcher (smoke scale, CPU, float32 compute so that no bf16 rounding flips a near tie): at the last
step, the answers in report/samples.jsonl are, token for token, what transformers' greedy `generate` gives on that
step's export, for native (the smoke config's bundled prompts, 2 ranks, validation every 2 steps: samples at 0, 2,
4) and native with LoRA (the merged export), v5 without and with LoRA (the PEFT adapter over its base), nki_moe
without and with LoRA (2 ranks, the merged export); every sampling forward had a shape the generator announced;
report/samples.md shows each prompt's answers step by step; a run stopped and resumed keeps its samples and goes
on; a bad SAMPLE_PROMPTS stops the launch in one line.
Run: .venv/bin/python -m pytest tests/test_samples.py -q
"""

import functools
import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from conftest import REPO, rank_logs, side_by_side_env

FP32 = "--training.mixed_precision_param float32"
TOKENS = 12
PROMPTS = [
    {"messages": [{"role": "user", "content": "What is 3 plus 4?"}], "enable_thinking": False},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name a river."},
            {"role": "assistant", "content": "The Rhine."},
        ]
    },  # the trailing answer is left out
    {"prompt": "Say three words.", "enable_thinking": True},
]


def write(path, rows):
    Path(path).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def smoke_tokenizer():
    from neuron_qwen3 import config_registry

    return str(config_registry.SMOKE_TOKENIZER)


def titan_tokenizer(folder=None):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    return HuggingFaceTokenizer(tokenizer_path=folder or smoke_tokenizer())


def transformers_ids(folder, row):
    """The prompt as transformers renders and tokenizes it for generation."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    messages = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
    while messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    options = {} if row.get("enable_thinking") is None else {"enable_thinking": row["enable_thinking"]}
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **options
    )


def greedy(model, ids, stops, tokens=TOKENS):
    """transformers' greedy answer to `ids`: the new tokens, the stop token kept."""
    out = model.generate(
        torch.tensor([ids]),
        max_new_tokens=tokens,
        do_sample=False,
        eos_token_id=sorted(stops),
        pad_token_id=0,
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
    )
    return out[0, len(ids) :].tolist()


def test_the_prompts_are_transformers_generation_prompts(tmp_path):
    from neuron_qwen3.data.prompts import read_prompts

    path = write(tmp_path / "prompts.jsonl", PROMPTS)
    found = read_prompts(path, "messages", titan_tokenizer(), room=200)
    assert [p.ids for p in found] == [transformers_ids(smoke_tokenizer(), row) for row in PROMPTS]
    assert [p.text for p in found] == ["What is 3 plus 4?", "Name a river.", "Say three words."]
    assert [p.thinking for p in found] == [False, None, True] and found[1].origin == f"{path}:2"


@pytest.mark.parametrize(
    "row, says",
    [
        ({"messages": [{"role": "system", "content": "Be brief."}]}, "no user or tool turn to answer"),
        ({"messages": [{"role": "user", "content": "Hi"}], "enable_thinking": "yes"}, "enable_thinking is not true"),
        ({"messages": [{"role": "user", "content": "word " * 300}]}, "prompt tokens; the window leaves 200"),
        ({"text": "plain"}, "DATASET_FIELD='messages'"),
    ],
)
def test_a_bad_prompt_is_one_line_with_its_line(tmp_path, row, says):
    from neuron_qwen3.data import DataError
    from neuron_qwen3.data.prompts import read_prompts

    path = write(tmp_path / "prompts.jsonl", [PROMPTS[0], row])
    with pytest.raises(DataError) as error:
        read_prompts(path, "messages", titan_tokenizer(), room=200)
    assert str(error.value).startswith(f"{path}:2: ") and says in str(error.value) and "\n" not in str(error.value)


def sharegpt(row: dict) -> dict:
    """`row` in ShareGPT's form (`conversations` of from/value turns)."""
    roles = {"system": "system", "user": "human", "assistant": "gpt"}
    turns = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
    found = {"conversations": [{"from": roles[m["role"]], "value": m["content"]} for m in turns]}
    return found | ({"enable_thinking": row["enable_thinking"]} if "enable_thinking" in row else {})


@pytest.mark.parametrize("field", ["messages", "conversations"])
def test_a_prompts_file_is_read_in_its_own_form_whatever_the_data_field(tmp_path, field):
    from neuron_qwen3.data.prompts import read_prompts

    openai = read_prompts(write(tmp_path / "openai.jsonl", PROMPTS), field, titan_tokenizer(), room=200)
    share = read_prompts(
        write(tmp_path / "sharegpt.jsonl", [sharegpt(row) for row in PROMPTS]), field, titan_tokenizer(), room=200
    )
    assert [p.ids for p in share] == [p.ids for p in openai]
    assert [p.ids for p in openai] == [transformers_ids(smoke_tokenizer(), row) for row in PROMPTS]


def test_sharegpt_training_data_beside_the_bundled_prompts_passes_the_pre_launch_pass(tmp_path):
    from conftest import recipes_pass

    chat = write(tmp_path / "chat.jsonl", [sharegpt(PROMPTS[1])] * 4)
    answer = recipes_pass(tmp_path, DATASET=chat, DATASET_FIELD="conversations")
    assert answer["problems"] == [], answer["problems"]
    assert any(line.startswith("samples: 3 prompts answered") for line in answer["lines"]), answer["lines"]


def test_a_kv_cache_over_its_share_of_a_neuron_rank_is_refused_in_one_line(tmp_path, monkeypatch):
    from neuron_qwen3 import config_registry, shapes
    from neuron_qwen3.data.records import DataError
    from neuron_qwen3.report import samples

    config = config_registry.native_qwen3_smoke()
    config.samples.prompts = write(tmp_path / "prompts.jsonl", PROMPTS)
    config.device = "neuron"
    line, gathering = samples.before_launch(config)  # the bundled smoke model's cache is well within 10 % of 24 GiB
    assert "generator: 3 slots, prefill buckets" in line and "MiB" in line
    assert gathering.startswith("samples: weights gathered once a round") and gathering.endswith("of 24 GiB")
    monkeypatch.setitem(shapes.NEURON_GIB_PER_CORE, config.neuron.logical_nc_config, 1e-4)
    with pytest.raises(DataError, match=r"^SAMPLE_PROMPTS: the generator's KV cache \(3 slots x \d+ positions\)"):
        samples.before_launch(config)
    config.device = "cpu"  # no device memory known: no bound
    assert samples.before_launch(config)


def test_the_generator_keeps_the_weights_gathered_for_a_round_only_where_the_whole_model_fits():
    """Beside the sharded training state (60 % of a rank), the whole model's weights in bfloat16 and the cache:
    Qwen3-4B fits a trn2 core at LNC 2 (24 GiB) but not at LNC 1 (12 GiB); Qwen3-30B-A3B's 61 GB fits neither. On
    CPU nothing is budgeted."""
    from neuron_qwen3 import shapes
    from neuron_qwen3.generate.plan import gathers_once

    cache = 64 * 2**20

    def gathers(flavor, memory):
        shape = shapes.FLAVORS[flavor]
        return gathers_once(shape.parameters() * 2, shape.layer_parameters() * 2, cache, memory)

    assert gathers("4B", shapes.NEURON_GIB_PER_CORE[2])[0]
    assert not gathers("4B", shapes.NEURON_GIB_PER_CORE[1])[0]
    fits, _, line = gathers("30B-A3B", shapes.NEURON_GIB_PER_CORE[2])
    assert not fits and line.startswith("weights gathered at every forward pass: gathering them once a round")
    assert "would take 59.25 GiB" in line
    assert gathers("235B-A22B", None)[0]


def test_a_round_is_left_out_of_the_next_logged_steps_time():
    """torchtitan times a logged step from its last log (step time, tokens/s, MFU): a samples round in between is
    moved out of that interval, so what the next log measures is training alone."""
    import time
    from types import SimpleNamespace

    from neuron_qwen3.report import samples

    round_s = 0.3

    class Slow:
        def generate(self, prompts, sampling):
            time.sleep(round_s)
            return []

    processor = SimpleNamespace(time_last_log=time.perf_counter())  # torchtitan's MetricsProcessor field
    sampler = samples.Sampler.__new__(samples.Sampler)
    sampler.trainer = SimpleNamespace(model_parts=[torch.nn.Linear(1, 1)], metrics_processor=processor)
    sampler.generator, sampler.prompts, sampler.writer, sampler.seconds, sampler.last = Slow(), [], False, 0.0, None
    sampler.sample(2)
    assert sampler.seconds >= round_s
    assert time.perf_counter() - processor.time_last_log < round_s  # torchtitan's time_delta at the next log


# ---- through the launcher ------------------------------------------------------------------------------------


def launch(tmp, name, **env):
    """A smoke launch; without SAMPLE_PROMPTS, the smoke config's own (the bundled prompts)."""
    out = Path(tmp) / f"{name}-out"
    env = side_by_side_env(
        **{
            "SCALE": "smoke",
            "OUTPUT_DIR": str(out),
            "CACHE_DIR": f"{tmp}/cache",
            "SAMPLE_TOKENS": str(TOKENS),
            "EXPORT_DTYPE": "float32",
            "EXPORT_DIR": f"{tmp}/{name}",
            "EXTRA_ARGS": FP32,
            **env,
        }
    )
    if not env["SAMPLE_PROMPTS"]:  # worker_env's "" turns them off
        del env["SAMPLE_PROMPTS"]
    result = subprocess.run(
        [sys.executable, "-m", "entrypoint"], env=env, cwd=REPO, capture_output=True, text=True, timeout=900
    )
    return result, out


@functools.cache
def runs(tmp):
    """Every launch once, two at a time: they are independent, and most of a launch is imports on one core."""
    from test_lora_finetune import save_dense, save_moe

    save_dense(f"{tmp}/dense-source")
    save_moe(f"{tmp}/moe-source")
    prompts = write(f"{tmp}/prompts.jsonl", PROMPTS)
    common = dict(STEPS="4", LR="3e-3", SAMPLE_PROMPTS=prompts)
    dense, moe = dict(INIT_FROM=f"{tmp}/dense-source"), dict(INIT_FROM=f"{tmp}/moe-source")

    def resumed():
        """nki_moe: 2 steps saved, then resumed to 4 in the same OUTPUT_DIR; the first launch's samples kept."""
        kept = dict(VARIANT="nki_moe", CHECKPOINT_DIR=f"{tmp}/moe-checkpoint", **moe)
        first = launch(tmp, "moe", **kept, **{**common, "STEPS": "2"})
        if (first[1] / "report" / "samples.jsonl").exists():
            shutil.copy(first[1] / "report" / "samples.jsonl", f"{tmp}/moe-first-samples.jsonl")
        return {"moe-first": first, "moe": launch(tmp, "moe", **kept, **common)}

    chains = [
        lambda: {
            "native": launch(
                tmp,
                "native",
                VARIANT="native",
                NPROC="2",
                VALIDATION="0.1",  # bundled prompts
                VALIDATION_INTERVAL="2",
                **dense,
                **{**common, "SAMPLE_PROMPTS": ""},
            )
        },
        resumed,
        lambda: {
            "moe-lora": launch(
                tmp, "moe-lora", VARIANT="nki_moe", NPROC="2", LORA_RANK="4", EXPORT_MERGED="1", **moe, **common
            )
        },
        lambda: {
            "native-lora": launch(
                tmp, "native-lora", VARIANT="native", LORA_RANK="4", EXPORT_MERGED="1", **dense, **common
            )
        },
        lambda: {"v5": launch(tmp, "v5", VARIANT="v5", **dense, **common)},
        lambda: {"v5-lora": launch(tmp, "v5-lora", VARIANT="v5", LORA_RANK="4", **dense, **common)},
    ]
    with ThreadPoolExecutor(2) as pool:
        return {name: run for found in pool.map(lambda chain: chain(), chains) for name, run in found.items()}


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("samples"))
    return tmp, runs(tmp)


def sampled(done, name):
    tmp, found = done
    result, out = found[name]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + rank_logs(out)
    rows = [json.loads(line) for line in (out / "report" / "samples.jsonl").read_text().splitlines()]
    summary = json.loads((out / "report" / "summary.json").read_text())
    return rows, summary, out


def exported_model(tmp, name):
    import transformers

    export = f"{tmp}/{name}"
    if name == "v5-lora":  # the PEFT adapter folder alone, over its base
        from peft import PeftModel

        base = transformers.AutoModelForCausalLM.from_pretrained(f"{tmp}/dense-source", torch_dtype=torch.float32)
        return PeftModel.from_pretrained(base, export).eval()
    return transformers.AutoModelForCausalLM.from_pretrained(export, torch_dtype=torch.float32).eval()


@pytest.mark.training
@pytest.mark.parametrize("name", ["native", "native-lora", "v5", "v5-lora", "moe", "moe-lora"])
def test_the_last_answers_are_transformers_greedy_answers_on_the_export(done, name):
    from neuron_qwen3 import config_registry
    from neuron_qwen3.generate import setup as generator_setup

    rows, summary, _ = sampled(done, name)
    tmp = done[0]
    last = [row for row in rows if row["step"] == 4]
    path = last[0]["prompt"].rsplit(":", 1)[0]  # the bundled prompts for native
    assert path == (str(config_registry.SMOKE_PROMPTS) if name == "native" else f"{tmp}/prompts.jsonl")
    prompts = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert [row["prompt"] for row in last] == [f"{path}:{k}" for k in range(1, len(prompts) + 1)]
    stops = generator_setup.stop_ids(titan_tokenizer())
    model = exported_model(tmp, name)
    with torch.no_grad():
        for row, prompt in zip(last, prompts):
            assert row["tokens"] == greedy(model, transformers_ids(smoke_tokenizer(), prompt), stops), row
            assert row["stop"] == ("end" if row["tokens"][-1] in stops else "length")
    announced, ran = summary["samples"]["shapes"], summary["samples"]["forwards"]
    assert [phase for phase, _ in announced][-1] == "decode" and len(announced) <= 5  # a handful, fixed before
    assert {(phase, tuple(shape)) for phase, shape, _ in ran} <= {(phase, tuple(shape)) for phase, shape in announced}
    counts = {phase: sum(n for p, _, n in ran if p == phase) for phase in ("prefill", "decode")}
    assert 0 < counts["decode"] <= counts["prefill"] * (TOKENS - 1)  # one wave a round: 3 prompts, 3 slots


@pytest.mark.training
def test_samples_come_at_step_0_every_validation_and_after_the_last(done):
    rows, summary, out = sampled(done, "native")
    assert [row["step"] for row in rows] == [0] * 3 + [2] * 3 + [4] * 3
    assert summary["validation"]["steps"] == [1, 2, 4]  # torchtitan validates at step 1 too; samples at 0
    page = (out / "report" / "samples.md").read_text()
    assert page.count("| 0 |") == page.count("| 2 |") == page.count("| 4 |") == 3 and "![loss](loss.png)" in page
    assert [row["answer"] for row in rows[:3]] != [row["answer"] for row in rows[-3:]]  # it trained
    events = list((out / "tb").rglob("samples/events.out.tfevents.*"))
    assert events, sorted(str(p) for p in out.rglob("*"))


@pytest.mark.training
def test_a_resumed_run_continues_its_samples(done):
    """The first launch answered at 0 and after its last step, 2, where it saved; the resumed one keeps those
    and answers after its own last step, 4."""
    result, out = done[1]["moe-first"]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + rank_logs(out)
    first = [json.loads(line) for line in Path(done[0], "moe-first-samples.jsonl").read_text().splitlines()]
    assert [row["step"] for row in first] == [0] * 3 + [2] * 3
    rows, _, _ = sampled(done, "moe")
    assert "checkpoints: resuming from step 2" in done[1]["moe"][0].stdout + done[1]["moe"][0].stderr
    assert [row["step"] for row in rows] == [0] * 3 + [2] * 3 + [4] * 3 and rows[:6] == first


@pytest.mark.training
def test_a_bad_prompt_file_stops_the_launch_in_one_line(tmp_path):
    bad = write(tmp_path / "prompts.jsonl", [PROMPTS[0], {"messages": [{"role": "system", "content": "x"}]}])
    result, _ = launch(tmp_path, "bad", VARIANT="native", SAMPLE_PROMPTS=bad, STEPS="1", EXTRA_ARGS="")
    assert result.returncode == 2 and "torch.distributed.run" not in result.stdout
    lines = [line for line in result.stderr.splitlines() if "SAMPLE_PROMPTS" in line]
    assert lines == [f"entrypoint: SAMPLE_PROMPTS: {bad}:2: no user or tool turn to answer"], result.stderr[-2000:]


@pytest.mark.training
def test_sharegpt_data_trains_at_smoke_scale_with_the_bundled_prompts(tmp_path):
    chat = write(tmp_path / "chat.jsonl", [sharegpt(PROMPTS[1])] * 16)
    result, out = launch(tmp_path, "sharegpt", VARIANT="native", DATASET=chat, DATASET_FIELD="conversations", STEPS="2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + rank_logs(out)
    rows = [json.loads(line) for line in (out / "report" / "samples.jsonl").read_text().splitlines()]
    assert {row["step"] for row in rows} == {0, 2} and all(row["tokens"] for row in rows)
