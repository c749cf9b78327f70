"""Two ranks under FSDP2 (gloo) answer different prompts, as GRPO's ranks and its held-out validation do, each
rank a different number of waves, or none. The rounds run twice: weights gathered once a round
(quirks/fsdp_round.py), then gathered at every forward pass as torchtitan shards them. Each rank writes to
OUT/rank<r>.json, for each way: its answers, its forward passes and FSDP's all-gathers, and after them whether the
weights are sharded and each unit's reshard-after-forward. Run under torchrun with the native smoke model's
Hugging Face folder.

argv: MODEL_DIR ASKED OUT; ASKED is a JSON file: {"stops": [...], "0": rank 0's rounds of prompts, "1": ...}
"""

import json
import sys
from pathlib import Path

import torch.distributed as dist
import torch.distributed.fsdp._fully_shard._fsdp_param_group as param_group
from safetensors.torch import load_file
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from neuron_qwen3 import config_registry
from neuron_qwen3.generate.engine import Generator
from neuron_qwen3.generate.plan import Plan
from neuron_qwen3.generate.sampling import Sampling
from neuron_qwen3.quirks import cpu_adapter
from neuron_qwen3.run import teardown

folder, asked, out = sys.argv[1], json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3])
cpu_adapter.activate()
dist.init_process_group("gloo")
rank = dist.get_rank()
config = config_registry.native_qwen3_smoke()
model_config = config.model_spec.model
model_config.update_from_config(config=config)
model = model_config.build()
weights = load_file(f"{folder}/model.safetensors")
model.load_state_dict(config.model_spec.state_dict_adapter(model_config, None).from_hf(weights))
for layer in model.layers.values():
    fully_shard(layer)
fully_shard(model)
model.eval()

gathers = 0
all_gather = param_group.foreach_all_gather


def counted(*args, **kwargs):
    global gathers
    gathers += 1
    return all_gather(*args, **kwargs)


param_group.foreach_all_gather = counted
units = [m for m in model.modules() if isinstance(m, FSDPModule)]


def choices() -> list:
    """Each unit's reshard-after-forward, the root first: False where FSDP keeps its weights after a forward pass."""
    return [g.post_forward_mesh_info is not None for u in units for g in u._get_fsdp_state()._fsdp_param_groups]


# the gathered way first, so that its rounds hold the model's first forward pass (the root's lazy set-up)
found = {"units": len(units), "blocks": len(model.layers), "rounds": len(asked[str(rank)])}
for way in ("once", "each_forward"):
    generator = Generator(model, Plan(**asked["plan"]), stops=set(asked["stops"]), gather_once=way == "once")
    gathers, answers = 0, []
    for prompts in asked[str(rank)]:
        answers.append([a.tokens for a in generator.generate(prompts, Sampling())])
    found[way] = {"answers": answers, "forwards": sum(generator.forwards.values()), "gathers": gathers}
    found[way]["choices_after"] = choices()
    found[way]["blocks_sharded"] = all(isinstance(p, DTensor) for p in model.layers.parameters())
    found[way]["all_sharded"] = all(isinstance(p, DTensor) for p in model.parameters())
(out / f"rank{rank}.json").write_text(json.dumps(found))
teardown.destroy_process_groups()
