"""TRL's DPOTrainer on the same pairs, policy, reference and optimizer settings as a METHOD=dpo run; prints JSON.

argv: policy folder, reference folder, pairs .jsonl, tokenizer folder, beta, learning rate, loss type.
All the pairs form one batch (the run under test trains them all in each step). Prints
{"step0": TRL's metrics on the batch before training (loss with the MoE aux term as TRL adds it, rewards,
accuracy, logps), "step1_loss": the loss on the batch after one optimizer step (torchtitan's settings in the run:
trl_as_titan.py)}.
"""

import json
import sys

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer
from trl_as_titan import OPTIMIZER  # beside this file

policy, reference, pairs, tokenizer_folder, beta, lr, loss_type = sys.argv[1:8]
records = [json.loads(line) for line in open(pairs) if line.strip()]
torch.manual_seed(0)
args = DPOConfig(
    output_dir="/tmp/trl-dpo-unused",
    beta=float(beta),
    learning_rate=float(lr),
    loss_type=[loss_type],
    max_steps=1,
    per_device_train_batch_size=len(records),
    max_length=None,
    logging_strategy="no",
    dataloader_drop_last=False,
    data_seed=0,
    **OPTIMIZER,
)
trainer = DPOTrainer(
    model=AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32),
    ref_model=AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32),
    args=args,
    train_dataset=Dataset.from_list(records),
    processing_class=AutoTokenizer.from_pretrained(tokenizer_folder),
)
batch = next(iter(trainer.get_train_dataloader()))
assert batch["input_ids"].shape[0] == 2 * len(records)


def measured():
    trainer.model.train()  # the metrics of a training step (TRL files them by the model's mode)
    trainer._metrics["train"].clear()
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, batch)
    return {"loss": float(loss), **{k: v[-1] for k, v in trainer._metrics["train"].items()}}


before = measured()
trainer.train()
after = measured()
print(json.dumps({"step0": before, "step1_loss": after["loss"], "aux": trainer.aux_loss_enabled}))
