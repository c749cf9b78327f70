"""The generator: the model being trained answers prompts with a KV cache, at the plan's shapes only.

It runs the trainer's own model (torchtitan's Qwen3 for native and nki_moe, the transformers model for v5) under
FSDP on every rank, with the weights the step just trained: no copy, no export. Prompts go in waves of `slots`;
a wave is one prefill of its bucket and decode steps of one token per slot, a finished or empty slot masked, not
removed. Every rank runs the same number of forward passes (FSDP gathers weights in them): the ranks agree on the
number of waves first, and on "all finished" every `agree_every` decode steps, not every token. Where the whole
model's weights fit beside the training state, a round gathers each FSDP unit once and frees it at the round's end.
"""

import collections
import contextlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from neuron_qwen3.generate import cache as kv
from neuron_qwen3.generate.plan import Plan
from neuron_qwen3.generate.sampling import Sampling, draw
from neuron_qwen3.interval import IntervalSums
from neuron_qwen3.quirks import fsdp_round


@dataclass
class Completion:
    tokens: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)  # log_softmax of the model's logits at each token drawn
    stop: str = "length"  # "end": the last token is a stop token; "length": the budget ran out


def kind_of(model) -> str:
    """ "titan": torchtitan's Qwen3 (native, nki_moe); "titan_hf": torchtitan's transformers backend (v5);
    "hf": a transformers model itself (an exported folder, the offline command's)."""
    from torchtitan.experiments.transformers_modeling_backend.model import HFTransformerModel
    from transformers import PreTrainedModel

    if isinstance(model, HFTransformerModel):
        return "titan_hf"
    return "hf" if isinstance(model, PreTrainedModel) else "titan"


class Generator:
    """`generate(prompts, sampling, rng)` answers lists of token ids; every rank calls it with its own prompts."""

    def __init__(self, model, plan: Plan, stops: set, agree_every: int = 8, pad_id: int = 0, gather_once=False):
        """`gather_once`: each FSDP unit's weights are gathered once a round, not at every forward pass
        (quirks/fsdp_round.py); plan.gathers_once says whether they fit."""
        self.model, self.plan, self.stops, self.agree_every, self.pad_id = model, plan, set(stops), agree_every, pad_id
        self.gather_once = gather_once
        self.kind = kind_of(model)
        self.cache = kv.KVCache(len(kv.layers_of(model)), plan.slots, plan.length, plan.query_block)
        self.forwards = collections.Counter()  # (phase, input shape) -> forward passes

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, prompts: list, sampling: Sampling, rng: torch.Generator | None = None) -> list[Completion]:
        assert sampling.greedy or rng is not None, "sampling draws from a seeded generator"
        waves = [prompts[i : i + self.plan.slots] for i in range(0, len(prompts), self.plan.slots)]
        count = self._agreed(len(waves), "max")
        answers = []
        gathered = fsdp_round.gathered(self.model) if self.gather_once else contextlib.nullcontext()
        with torch.no_grad(), kv.installed(self.model, self.cache), gathered, self._hidden_states():
            for i in range(count):
                answers += self._wave(waves[i] if i < len(waves) else [], sampling, rng)
        return answers

    @contextlib.contextmanager
    def _hidden_states(self):
        """torchtitan's models stop before the lm_head (its `_skip_lm_head`, as for its chunked loss): the logits
        are made for the one position each row reads, not for every position of a prefill bucket, whose
        [slots, bucket, vocab] a real vocabulary makes gigabytes."""
        if self.kind == "hf":
            yield
            return
        saved, self.model._skip_lm_head = self.model._skip_lm_head, True
        try:
            yield
        finally:
            self.model._skip_lm_head = saved

    def _wave(self, prompts: list, sampling: Sampling, rng) -> list[Completion]:
        slots = self.plan.slots
        bucket = self.plan.bucket(max(map(len, prompts), default=1))
        tokens = torch.full((slots, bucket), self.pad_id, dtype=torch.long)
        lengths = torch.ones(slots, dtype=torch.long)  # an empty slot: one pad token
        for s, ids in enumerate(prompts):
            tokens[s, : len(ids)], lengths[s] = torch.tensor(ids), len(ids)
        live = torch.arange(slots) < len(prompts)
        out = [Completion() for _ in prompts]
        positions = torch.arange(bucket).expand(slots, bucket)
        logits = self._forward("prefill", tokens, positions, torch.zeros(slots, dtype=torch.long), bucket, lengths - 1)
        for step in range(self.plan.new_tokens):
            picks, logprobs = draw(logits, sampling, rng)
            picks, logprobs = picks.cpu(), logprobs.cpu()
            for s in live.nonzero().flatten().tolist():
                out[s].tokens.append(int(picks[s]))
                out[s].logprobs.append(float(logprobs[s]))
                if int(picks[s]) in self.stops:
                    out[s].stop, live[s] = "end", False
            done = step + 1 == self.plan.new_tokens
            if done or (step + 1) % self.agree_every == 0 and not self._agreed(int(live.sum()), "sum"):
                break
            # each live slot's pick goes to its next position; a finished slot stays where it is and rewrites a
            # position past its end, which no query reads
            picks = torch.where(live, picks, torch.full_like(picks, self.pad_id))
            logits = self._forward("decode", picks[:, None], lengths[:, None], lengths, self.cache.length, None)
            lengths = torch.where(live, lengths + 1, lengths)
        return out

    def _forward(self, phase, tokens, positions, start, keys, read):
        """Logits [slots, vocab] of the token at `read` in each row (the last one when None): the model's hidden
        states, then its lm_head on those positions only."""
        self.forwards[(phase, tuple(tokens.shape))] += 1
        device = self.device
        self.cache.step = kv.Step(start.to(device), tokens.shape[1], keys)
        tokens, positions = tokens.to(device), positions.to(device)
        if self.kind == "titan_hf":
            # a mask of the backend's own would be a flex BlockMask (compiled): the cache's step is the mask
            hidden = self.model(tokens, positions=positions, attention_masks=self.cache.step, use_cache=False)
        elif self.kind == "hf":
            hidden = self.model.model(input_ids=tokens, position_ids=positions, use_cache=False).last_hidden_state
        else:
            hidden = self.model(tokens, positions=positions, attention_masks=None)
        self.cache.step = None
        rows = torch.arange(tokens.shape[0], device=device)
        hidden = hidden[rows, read.to(device)] if read is not None else hidden[:, -1]
        return self.model.lm_head(hidden)

    def _agreed(self, value: int, across: str) -> int:
        """`value` over every rank (`across`: "sum" or "max"): the waves and the live slots all ranks run."""
        world = dist.is_initialized() and dist.get_world_size() > 1
        figures = IntervalSums(dist.group.WORLD if world else None, self.device)
        figures.add(across=across, value=value)
        return int(figures.reduced()["value"])
