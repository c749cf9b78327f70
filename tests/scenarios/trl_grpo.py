"""TRL's GRPOTrainer on the completions a METHOD=grpo run generated, the same policy, rewards and optimizer
settings; prints JSON.

argv: policy folder, rollouts .json, tokenizer folder, settings .json[, a PEFT adapter folder: the policy is the base
with these adapters, their B set to 0 as a LoRA run starts (their A is the run's: a first step leaves A alone)].
- rollouts: one entry per prompt of the run's first generation, every rank's: {"prompt": the record's prompt,
  "prompt_ids", "completions": [token ids, ...], "logprobs": [the generator's, ...]}. TRL's `rollout_func` hands
  them over in place of its own generation, so both sides train on the same tokens.
- settings: {"generations", "max_completion", "lr", "beta", "loss", "steps", "iterations", "rewards": "module:fn"
  (the module's file lies beside the rollouts, as the run's lies beside its data)}.
All the completions form one batch (per_device_train_batch_size); the optimizer is torchtitan's settings in the run
(trl_as_titan.py). Prints {"logs": [each step's logged loss, grad_norm and metrics], "aux": whether TRL adds the
MoE load-balancing loss}.
"""

import importlib.util
import json
import os
import sys

import torch
import transformers
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer
from trl_as_titan import OPTIMIZER  # beside this file

policy, rollouts_path, tokenizer_folder, settings_path = sys.argv[1:5]
adapter = sys.argv[5] if len(sys.argv) > 5 else None
rollouts = json.load(open(rollouts_path))
settings = json.load(open(settings_path))
module, function = settings["rewards"].split(":")
spec = importlib.util.spec_from_file_location(module, os.path.join(os.path.dirname(rollouts_path), f"{module}.py"))
rewards = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rewards)
reward = getattr(rewards, function)
by_prompt = {json.dumps(r["prompt"]): r for r in rollouts}


def rollout(prompts, trainer):
    """Each prompt's completions, in the run's order: TRL repeats every prompt `generations` times in a row."""
    out, taken = {"prompt_ids": [], "completion_ids": [], "logprobs": []}, {}
    for prompt in prompts:
        key = json.dumps(prompt)
        found, k = by_prompt[key], taken.get(key, 0)
        taken[key] = k + 1
        out["prompt_ids"].append(found["prompt_ids"])
        out["completion_ids"].append(found["completions"][k])
        out["logprobs"].append(found["logprobs"][k])
    return out


steps = []


class Logs(transformers.TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            steps.append({"step": state.global_step, **logs})


torch.manual_seed(0)
completions = sum(len(r["completions"]) for r in rollouts)
args = GRPOConfig(
    output_dir=os.path.join(os.path.dirname(os.path.abspath(rollouts_path)), "trl-output"),  # nothing saved
    per_device_train_batch_size=completions,
    gradient_accumulation_steps=1,
    num_generations=settings["generations"],
    max_completion_length=settings["max_completion"],
    num_iterations=settings["iterations"],
    beta=settings["beta"],
    loss_type=settings["loss"],
    learning_rate=settings["lr"],
    max_steps=settings["steps"],
    logging_steps=1,
    dataloader_num_workers=0,
    **OPTIMIZER,
)
model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
if adapter:
    from peft import PeftModel

    model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.zero_()
trainer = GRPOTrainer(
    model=model,
    reward_funcs=[reward],
    args=args,
    train_dataset=Dataset.from_list([{"prompt": r["prompt"]} for r in rollouts]),
    processing_class=AutoTokenizer.from_pretrained(tokenizer_folder),
    rollout_func=rollout,
)
trainer.add_callback(Logs())
trainer.train()
print(json.dumps({"logs": steps, "aux": trainer.aux_loss_enabled}))
