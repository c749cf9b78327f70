"""The rollout's micro-batches as the trainer takes them (rl/rollout.py), without a model:

- tokens/s counts each row's prompt and completion, not the padding after them (torchtitan counts every label);
- with GRPO_ITERATIONS above 1, the checkpoint's copy of the generation holds pi_old as the first pass kept it, on
  the host, and a resumed rollout hands the same values to the loss.
Run: .venv/bin/python -m pytest tests/test_grpo_rollout.py -q
"""

import types

import torch

from neuron_qwen3.rl.rollout import Rollout

SEQ_LEN, LENGTHS = 16, (5, 11, 16)  # three rows: their prompt and completion tokens, padded to SEQ_LEN


def rollout(left: int) -> Rollout:
    """A Rollout holding one generated micro-batch with `left` passes to go, its generator never built."""
    found = Rollout.__new__(Rollout)
    metrics = types.SimpleNamespace(ntokens_since_last_log=0, data_loading_times=[])
    found.trainer, found.rank = types.SimpleNamespace(metrics_processor=metrics), 0
    found.config = types.SimpleNamespace(iterations=2)
    real = torch.stack([torch.arange(SEQ_LEN) < n for n in LENGTHS])
    columns = {"input": torch.zeros(3, SEQ_LEN, dtype=torch.long), "real": real, "old": torch.zeros(3, SEQ_LEN)}
    columns["learner_old"] = []
    found.buffer, found.left = [(columns, torch.zeros(3, SEQ_LEN, dtype=torch.long))], left
    return found


def test_tokens_per_second_count_the_rows_tokens_not_their_padding():
    ours = rollout(left=2)
    next(ours.batches(iter(())))
    assert ours.trainer.metrics_processor.ntokens_since_last_log == sum(LENGTHS) < 3 * SEQ_LEN


def test_a_checkpoint_between_two_passes_keeps_the_first_passs_pi_old():
    ours = rollout(left=1)
    kept = torch.randn(3, SEQ_LEN)
    ours.buffer[0][0]["learner_old"].append(kept)
    state = ours.state_dict()
    resumed = rollout(left=0)
    resumed.load_state_dict(state)
    columns, _ = next(resumed.batches(iter(())))
    assert resumed.left == 0 and len(columns["learner_old"]) == 1
    assert torch.equal(columns["learner_old"][0], kept) and columns["learner_old"][0].device.type == "cpu"
