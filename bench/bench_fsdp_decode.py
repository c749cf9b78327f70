"""The generator under FSDP2 with each forward pass gathering every block's weights and freeing them after
(torchtitan's reshard-after-forward), once per decode step, against the same round with the weights gathered once
for the whole round (`Generator(gather_once=True)`, quirks/fsdp_round.py: what samples and GRPO do where the whole
model fits).

    .venv/bin/python -m torch.distributed.run --nproc_per_node=1 -m bench.bench_fsdp_decode
    .venv/bin/python -m torch.distributed.run --nproc_per_node=2 -m bench.bench_fsdp_decode --scale smoke

The model: torchtitan's native Qwen3 of the scale's config (bench_cpu: 0.2 B, 16 layers), random weights, float32,
each block and the root sharded as torchtitan shards them (gloo, CPU). A round: `--slots` prompts of 4 tokens,
`--tokens` new tokens each, greedy. The sides alternate, `--reps` rounds each after one warm-up; both must give the
same tokens. Printed by rank 0: each side's seconds a round (median and range), the ratio, and the bytes of the
whole model's weights, which the gathered side holds on every rank for the length of a round.
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default="bench_cpu", choices=["smoke", "bench_cpu"])
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    return parser.parse_args()


def sharded_model(scale: str):
    from neuron_qwen3 import config_registry

    torch.manual_seed(0)
    config = getattr(config_registry, f"native_qwen3_{scale}")()
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    model = model_config.build()
    model.init_weights()
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    for layer in model.layers.values():
        fully_shard(layer)
    fully_shard(model)
    return model.eval(), whole


def main():
    from neuron_qwen3.generate.engine import Generator
    from neuron_qwen3.generate.plan import Plan
    from neuron_qwen3.generate.sampling import Sampling
    from neuron_qwen3.quirks import cpu_adapter
    from neuron_qwen3.run import teardown

    args = arguments()
    cpu_adapter.activate()
    dist.init_process_group("gloo")
    model, whole = sharded_model(args.scale)
    plan = Plan(slots=args.slots, buckets=(32,), new_tokens=args.tokens)
    generators = {gathered: Generator(model, plan, stops=set(), gather_once=gathered) for gathered in (False, True)}
    prompts = [[5 + k, 6, 7, 8] for k in range(args.slots)]

    def round_(gathered: bool):
        began = time.perf_counter()
        tokens = [a.tokens for a in generators[gathered].generate(prompts, Sampling())]
        return time.perf_counter() - began, tokens

    _, expected = round_(False)  # warm-up, both sides
    round_(True)
    seconds = {False: [], True: []}
    for _ in range(args.reps):
        for gathered in (False, True):
            took, tokens = round_(gathered)
            seconds[gathered].append(took)
            assert tokens == expected, "the two sides answered differently"
    if dist.get_rank() == 0:
        each, once = statistics.median(seconds[False]), statistics.median(seconds[True])
        spread = lambda xs: f"{min(xs):.2f}-{max(xs):.2f}"  # noqa: E731
        print(
            f"{dist.get_world_size()} rank(s), {args.scale}, {args.slots} slots x {args.tokens} tokens: "
            f"gathered per forward {each:.2f} s ({spread(seconds[False])}), gathered for the round {once:.2f} s "
            f"({spread(seconds[True])}): {each / once:.2f}x; the whole model's weights {whole / 2**20:.0f} MiB"
        )
    teardown.destroy_process_groups()


if __name__ == "__main__":
    main()
