"""The generator's device memory against the plan's figure, on the simulated `neuron` device, whose allocator
counts every byte a run holds (tests/neuron_sim). CPU has no such count. The device's
extension is built at the first start (about 25 s).

    NEURON_SIM=1 PYTHONPATH=tests/neuron_sim/site:recipes:. .venv/bin/python -m torch.distributed.run \\
        --nproc_per_node=2 -m bench.bench_generate_memory

The scale's model (torchtitan's native Qwen3, random weights; bench_cpu: 0.2 B) sharded as torchtitan shards it
(each block a unit, the root last) with bfloat16 weights gathered from float32 shards, as a trn2 run holds them.
The bundled sample prompts answered greedily, the generator's plan as the samples make it (SAMPLE_TOKENS new
tokens), once with the weights gathered for the round and once gathered at every forward pass. For each: the peak
bytes the round added over what the rank held before it; gathered once, against the plan's figure
(generate/plan.py, through report/samples.py).
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default="bench_cpu", choices=["smoke", "bench_cpu"])
    parser.add_argument("--tokens", type=int, default=48, help="new tokens a prompt gets (SAMPLE_TOKENS)")
    return parser.parse_args()


def main():
    import neuron_sim  # loaded at start-up by tests/neuron_sim/site (NEURON_SIM=1)

    from neuron_qwen3 import config_registry
    from neuron_qwen3.generate.engine import Generator
    from neuron_qwen3.generate.plan import size
    from neuron_qwen3.generate.sampling import Sampling
    from neuron_qwen3.report import samples
    from neuron_qwen3.generate import setup as generator_setup
    from neuron_qwen3.run import teardown

    assert neuron_sim.installed(), "NEURON_SIM=1 and tests/neuron_sim/site on PYTHONPATH"
    args = arguments()
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    torch.neuron.set_device(device)
    dist.init_process_group(backend="cpu:gloo,neuron:neuron")
    config = getattr(config_registry, f"native_qwen3_{args.scale}")()
    config.samples.tokens = args.tokens
    config.training.mixed_precision_param = "bfloat16"  # a trn2 run's; the CPU configs gather float32
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    torch.manual_seed(0)
    model = model_config.build()
    model.init_weights()
    model = model.to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers.values():
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    model.eval()

    prompts = samples.prompts_of(config, generator_setup.tokenizer_of(config))
    plan = samples.plan_of(config, prompts)
    _, need, line = generator_setup.gathering(config, plan, None)
    peaks = {}
    for gathered in (True, False):
        generator = Generator(
            model, plan, generator_setup.stop_ids(generator_setup.tokenizer_of(config)), gather_once=gathered
        )
        torch.neuron.synchronize()
        before = torch.neuron.memory_allocated()
        torch.neuron.reset_peak_memory_stats()
        generator.generate([p.ids for p in prompts], Sampling())
        peaks[gathered] = torch.neuron.max_memory_allocated() - before
        del generator
    if dist.get_rank() == 0:
        print(f"{dist.get_world_size()} ranks, {args.scale}, {plan}; the plan: {line}")
        print(f"gathered once a round: the round added {size(peaks[True])} at its peak: {peaks[True] / need:.3f}x")
        print(f"gathered per forward pass: the round added {size(peaks[False])} at its peak")
    teardown.destroy_process_groups()


if __name__ == "__main__":
    main()
