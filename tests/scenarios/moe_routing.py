"""The project's nki_moe trainer, loaded from a Hugging Face folder, run one train_step per given global batch;
run under torchrun (1 or more ranks, gloo).

argv: shape (smoke: the nki_moe smoke config; real_width: Qwen3-30B-A3B's width, tests/real_width_recipes.py's
shape with the smoke tokenizer's 2048-token vocabulary), the INIT_FROM folder (transformers saved it), a torch.save
file of global batches (a list of {"input", "positions", "real", "labels"}, each [G, S]), the output folder, then
any more torchtitan flags. The trainer is the one `torchtitan.train` builds (the project's RunHooks: the router
watch attached to its loss_fn and metrics, `real` popped in post_dataloading_process), with the launcher's
INIT_FROM flags, float32 throughout (the experts too: compute_dtype float32, as finish.cpu_float32 makes a
full-scale config on CPU) and learning rate 0, so every step sees the loaded weights. Rank r of W trains rows
[r*G/W, (r+1)*G/W) of each global batch: every rank count trains the same global batch.

Each rank writes <out>/rank<r>.json: per step, what torchtitan's loggers received (the metrics dict of
MetricsProcessor.log: loss_metrics/global_avg_loss, moe/aux_loss, moe/z_loss, ...), the router watch's `last`
and the coefficients finish() resolved; rank 0 also <out>/grads.pt, per step every router gate's whole gradient.
"""

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torchtitan.components.metrics import BaseLogger, LoggerContainer
from torchtitan.config import ConfigManager

from neuron_qwen3 import config_registry, shapes
from neuron_qwen3.finish import NKI_EXPERTS
from neuron_qwen3.hf import weights
from neuron_qwen3.moe.experts import NKIGroupedExperts
from neuron_qwen3.run import teardown

# tests/real_width_recipes.py's SHAPE (2 layers of 8 experts, top 2, at 30B-A3B's width) on the smoke vocabulary:
# the routers see the real width; the vocabulary only sizes the embedding and lm_head
REAL_WIDTH = dataclasses.replace(shapes.FLAVORS["30B-A3B"], n_layers=2, num_experts=8, top_k=2, vocab_size=2048)


def smoke():
    config = config_registry.nki_moe_qwen3_smoke()
    config.override.imports = [(NKI_EXPERTS, {"compute_dtype": "float32"})]  # as packed_loss.py: fp32 experts
    return config


def real_width():
    """Derived from the full nki_moe config (report scale full): on CPU finish() makes it float32, experts too."""
    return config_registry._with_small_model(config_registry.nki_moe_qwen3_30b_a3b(), "real_width", REAL_WIDTH)


class Seen(BaseLogger):
    """What torchtitan's loggers (TensorBoard, W&B, the run report) receive, by step."""

    def __init__(self):
        self.steps = {}

    def log(self, metrics, step):
        self.steps[step] = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}


def whole(tensor):
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().clone()


def main() -> None:
    shape, source, batches, out = sys.argv[1:5]
    batches = torch.load(batches)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rows = batches[0]["input"].shape[0]
    assert rows % world == 0, (rows, world)
    local = rows // world
    flags = [
        "--module",
        "__main__",
        "--config",
        shape,
        "--device=cpu",
        "--checkpoint.enable",
        f"--checkpoint.initial_load_path={source}",
        "--checkpoint.initial_load_in_hf",
        "--checkpoint.initial_load_model_only",
        "--checkpoint.load_only",
        f"--dump_folder={out}",
        "--tune.lr",
        "0",
        "--training.max_norm",
        "1e9",
        "--training.mixed_precision_param",
        "float32",
        "--training.seq_len",
        str(batches[0]["input"].shape[1]),
        "--training.local_batch_size",
        str(local),
        "--training.steps",
        str(len(batches) + 1),
        *sys.argv[5:],
    ]
    config = ConfigManager().parse_args(flags)
    trainer = config.build()
    seen = Seen()
    metrics = trainer.metrics_processor
    if not isinstance(metrics.logger, LoggerContainer):
        container = LoggerContainer()
        container.add_logger(metrics.logger)
        metrics.logger = container
    metrics.logger.add_logger(seen)
    weights.check_coverage(trainer)
    weights.initial_load(trainer)  # as RunHooks.train does before torchtitan's loop
    rank = dist.get_rank() if dist.is_initialized() else 0
    model = trainer.model_parts[0]
    gates = [name for name, _ in model.named_parameters() if name.endswith("router.gate.weight")]
    assert gates, "no MoE router"
    found, grads = [], []
    mine = slice(rank * local, (rank + 1) * local)
    for batch in batches:
        trainer.step += 1
        window = {key: batch[key][mine] for key in ("input", "positions", "real")}
        counted = int(window["real"].sum())  # the trainer pops `real` from the window
        trainer.train_step(trainer.batch_generator([(window, batch["labels"][mine])]))
        params = dict(model.named_parameters())
        grads.append(
            {
                name.replace("_checkpoint_wrapped_module.", ""): whole(params[name].grad)  # a collective
                for name in gates
            }
        )
        watch = trainer.router_watch
        found.append(
            {
                "step": trainer.step,
                "metrics": seen.steps.get(trainer.step),
                "last": watch.last,
                "rows": counted,
                "labels": int((batch["labels"][mine] != -100).sum()),
            }
        )
    dtypes = sorted(
        {str(module.compute_dtype) for module in model.modules() if isinstance(module, NKIGroupedExperts)}
        | {str(param.dtype) for param in model.parameters()}
    )
    result = {
        "rank": rank,
        "world": world,
        "dtypes": dtypes,
        "aux_coef": trainer.config.moe.aux_loss,
        "z_coef": trainer.config.moe.z_loss,
        "watch_coefs": [watch.aux_coef, watch.z_coef],
        "accumulation": trainer.gradient_accumulation_steps,
        "steps": found,
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    if rank == 0:
        torch.save(grads, Path(out, "grads.pt"))
    trainer.close()
    teardown.destroy_process_groups()  # and the FSDP states' reference cycles, which hold the group (teardown.py)
    print(f"moe_routing done rank={rank}", flush=True)


if __name__ == "__main__":
    main()
