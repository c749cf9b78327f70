"""The generator (generate/) against transformers' `generate` with its static cache, and against the old samples
path (one forward pass of the whole training window per new token), on the same model and prompts, CPU, float32.

    .venv/bin/python -m bench.bench_generate                  # bench_cpu's model (0.2 B, 16 layers): ~5 min here
    .venv/bin/python -m bench.bench_generate --scale smoke    # the smoke model, ~1 min

The model: a random transformers Qwen3ForCausalLM of the scale's config.json, loaded into torchtitan's native
Qwen3 of the same config through its state-dict adapter (what a run trains). The prompts: the bundled
SAMPLE_PROMPTS, rendered with the bundled chat template. Each side answers greedily, `--tokens` new tokens each
(no stop token, so both sides decode the same count), `--reps` times, the sides alternated; one warm-up each.
Printed: each side's tokens/s over whole answers (prefill included) and over the decode steps alone (the answer's
time less the time to its first token, both measured, alternated), the ratios, and the KV cache's bytes against
the plan's.
The window-per-token path is rebuilt here for the comparison alone: each new token is one forward pass of the
[1, seq_len] window with the prompts packed as documents (the model's flex document mask), as report/samples.py
did before the generator.
"""

import argparse
import json
import statistics
import tempfile
import time

import torch


def models(scale: str, folder: str):
    import transformers

    from neuron_qwen3 import config_registry

    shape = json.loads((config_registry.HF_MODEL[scale] / "config.json").read_text())
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**shape)).save_pretrained(folder)
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    config = getattr(config_registry, f"native_qwen3_{scale}")()
    config.training.mixed_precision_param = "float32"
    model = config.model_spec.model.build()
    from safetensors.torch import load_file

    state = config.model_spec.state_dict_adapter(config.model_spec.model, None).from_hf(
        load_file(f"{folder}/model.safetensors")
    )
    model.load_state_dict(state)
    return model.eval(), reference, config.training.seq_len


def prompt_ids() -> list:
    from neuron_qwen3 import config_registry
    from neuron_qwen3.data.prompts import read_prompts
    from neuron_qwen3.generate import setup as generator_setup

    tokenizer = generator_setup.tokenizer_of(config_registry.native_qwen3_smoke())
    return [p.ids for p in read_prompts(str(config_registry.SMOKE_PROMPTS), "messages", tokenizer, 10**6)]


def ours(model, prompts, tokens, seq_len):
    from neuron_qwen3.generate.engine import Generator
    from neuron_qwen3.generate.plan import Plan, buckets_for
    from neuron_qwen3.generate.sampling import Sampling

    plan = Plan(len(prompts), buckets_for([len(p) for p in prompts], seq_len - tokens), tokens)
    generator = Generator(model, plan, stops=set())
    return generator, lambda: [a.tokens for a in generator.generate(prompts, Sampling())]


def theirs(reference, prompts, tokens):
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

    def run():
        with torch.no_grad():
            out = reference.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                pad_token_id=0,
                cache_implementation="static",
            )
        return out[:, width:].tolist()

    return run


def window_per_token(model, prompts, tokens, seq_len):
    """The old samples path: every prompt and its answer's room packed into one [1, seq_len] row as documents;
    each new token, one forward pass of the whole window."""
    window = torch.zeros((1, seq_len), dtype=torch.long)
    positions = torch.arange(seq_len).repeat(1, 1)
    ends, start = [], 0
    for ids in prompts:
        assert start + len(ids) + tokens <= seq_len
        window[0, start : start + len(ids)] = torch.tensor(ids)
        positions[0, start : start + len(ids) + tokens] = torch.arange(len(ids) + tokens)
        ends.append(start + len(ids))
        start += len(ids) + tokens

    def run():
        tokens_now, at = window.clone(), list(ends)
        masks = model.get_attention_masks(positions)
        out = [[] for _ in prompts]
        with torch.no_grad():
            for _ in range(tokens):
                logits = model(tokens_now, attention_masks=masks, positions=positions)[0, [a - 1 for a in at]]
                for k, pick in enumerate(logits.argmax(-1).tolist()):
                    out[k].append(pick)
                    tokens_now[0, at[k]] = pick
                    at[k] += 1
        return out

    return run


def seconds(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def timed(run, count: int) -> float:
    return count / seconds(run)


def spread(values) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", default="bench_cpu", choices=["smoke", "bench_cpu"])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--old-tokens", type=int, default=4, help="new tokens of the window-per-token side")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model, reference, seq_len = models(args.scale, tmp)
        prompts = prompt_ids()
        generator, new = ours(model, prompts, args.tokens, seq_len)
        hf = theirs(reference, prompts, args.tokens)
        old = window_per_token(model, prompts, args.old_tokens, seq_len)
        first = new()
        assert first == hf(), "the generator and transformers' static-cache generate answer differently"
        assert [t[: args.old_tokens] for t in first] == old(), "the window-per-token path answers differently"
        _, new_first = ours(model, prompts, 1, seq_len)
        hf_first = theirs(reference, prompts, 1)
        assert new_first() == hf_first() == [t[:1] for t in first], "the first tokens differ"
        count = args.tokens * len(prompts)
        rates = {"generator": [], "transformers static cache": [], "window per token": []}
        decode = {"generator": [], "transformers static cache": []}
        sides = (("generator", new, new_first), ("transformers static cache", hf, hf_first))
        for _ in range(args.reps):  # alternated, so that the machine's drift falls on every side alike
            for side, whole, first_token in sides:
                answers = seconds(whole)
                rates[side].append(count / answers)
                decode[side].append((count - len(prompts)) / (answers - seconds(first_token)))
            rates["window per token"].append(timed(old, args.old_tokens * len(prompts)))
        lengths = [len(p) for p in prompts]
        print(
            f"{args.scale}: {len(prompts)} prompts of {lengths} tokens, {args.tokens} new tokens each, window {seq_len}"
        )
        print(f"  shapes: {generator.plan.shapes()}")
        for name, values in rates.items():
            print(f"  {name}: {spread(values)} tokens/s over {args.reps} runs")
        for name, values in decode.items():
            print(f"  {name}, decode steps alone: {spread(values)} tokens/s")
        for what, table in (("whole answers", rates), ("decode steps alone", decode)):
            ratios = [a / b for a, b in zip(table["generator"], table["transformers static cache"])]
            print(
                f"  generator / transformers, {what}: {statistics.median(ratios):.2f} "
                f"({min(ratios):.2f}-{max(ratios):.2f})"
            )
        ratios = [a / b for a, b in zip(rates["generator"], rates["window per token"])]
        print(f"  generator / window per token: {statistics.median(ratios):.1f} ({min(ratios):.1f}-{max(ratios):.1f})")
        cache = generator.cache
        measured = cache.k.nbytes + cache.v.nbytes
        shape = cache.k.shape
        planned = generator.plan.cache_bytes(shape[0], shape[2], shape[4], cache.k.element_size())
        print(f"  KV cache: {measured / 2**20:.1f} MiB allocated, {planned / 2**20:.1f} MiB planned")


if __name__ == "__main__":
    main()
