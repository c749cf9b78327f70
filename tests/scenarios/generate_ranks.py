"""Two ranks under FSDP2 (gloo) answer different prompts, as GRPO's ranks and its held-out validation do, each
rank a different number of waves, or none. Each rank writes its answers and its forward passes to
OUT/rank<r>.json. Run under torchrun with the native smoke model's Hugging Face folder.

argv: MODEL_DIR ASKED OUT; ASKED is a JSON file: {"stops": [...], "0": rank 0's rounds of prompts, "1": ...}
"""

import json
import sys
from pathlib import Path

import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.fsdp import fully_shard

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

generator = Generator(model, Plan(**asked["plan"]), stops=set(asked["stops"]))
answers = [[a.tokens for a in generator.generate(prompts, Sampling())] for prompts in asked[str(rank)]]
forwards = sum(generator.forwards.values())
(out / f"rank{rank}.json").write_text(json.dumps({"answers": answers, "forwards": forwards}))
teardown.destroy_process_groups()
