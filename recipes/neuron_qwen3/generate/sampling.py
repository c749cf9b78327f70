"""The next token from the logits: greedy, or a draw after temperature, top-k, top-p and min-p, as transformers does.

Every op keeps the [slots, vocab] shape (a filter sets entries to -inf, it never slices to a data-dependent size),
so the filters compile to one graph whatever the settings' effect on a row. The log-probability returned with each
token is the unfiltered model's at the sampling temperature (1 when greedy), log_softmax(logits.float() / T)[token],
the number that the training forward computes and that online RL (GRPO, whose policy log-probabilities TRL takes at
the sampling temperature) compares the policy's with. The random draw uses a torch.Generator on the
CPU, whose stream is the same on every accelerator and is saved and restored with get_state/set_state, so that a
seed gives the same tokens on any device and after a resume; a sampled draw takes slots x vocab numbers from it
whatever the logits, so its position in the stream depends only on the shapes.

Differences from transformers' warpers (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
MinPLogitsWarper, chained in that order as `generate` chains them, with min_tokens_to_keep=1):
- top-p ties: among tokens of equal logit the lower index counts as the more probable, so where the nucleus ends
  inside a run of equal logits it keeps the lowest indices (as argmax does); transformers' unstable sort leaves that
  choice to the sort's implementation. Everything else is the same arithmetic (softmax of the ascending sort, its
  cumulative sum, removal where it is <= 1 - top_p), so the kept sets are the same bit for bit.
- top-k keeps, as transformers does, every token tied with the k-th largest logit (more than k where it ties).
- temperature 0 is greedy here (argmax, ties to the lowest index), where transformers asks for do_sample=False.
- min_p is < 1 here (transformers allows 1: only the tokens tied with the top one); top_p = 1 and min_p = 0 are off.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

_VOCAB_CHUNK = 32768  # columns upcast to float32 at a time by logprobs_of


@dataclass(frozen=True)
class Sampling:
    """How to pick the next token: temperature 0 is greedy (the filters then change nothing); top_k 0, top_p 1 and
    min_p 0 are off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self):
        # Written as `not (allowed)` so that NaN is refused too.
        for ok, field, allowed in (
            (self.temperature >= 0, "temperature", "temperature >= 0 (0 is greedy)"),
            (isinstance(self.top_k, int) and self.top_k >= 0, "top_k", "an integer top_k >= 0 (0 is off)"),
            (0 < self.top_p <= 1, "top_p", "0 < top_p <= 1 (1 is off)"),
            (0 <= self.min_p < 1, "min_p", "0 <= min_p < 1 (0 is off)"),
        ):
            if not ok:
                raise ValueError(f"Sampling {field}={getattr(self, field)!r} is out of range: it must be {allowed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filtered_logits(logits: Tensor, sampling: Sampling) -> Tensor:
    """[S, V] float32: logits / temperature, then top-k, top-p and min-p, the removed entries -inf; softmax of it is
    the distribution that `draw` samples. Greedy: -inf everywhere but each row's argmax (the limit as T -> 0)."""
    scores = logits.float()
    if sampling.greedy:
        keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, scores.argmax(-1, keepdim=True), True)
        return scores.masked_fill(~keep, -torch.inf)
    scores = scores / sampling.temperature
    if sampling.top_k:
        kth = torch.topk(scores, min(sampling.top_k, scores.size(-1)), dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, -torch.inf)
    if sampling.top_p < 1:
        # A stable descending sort puts the lower index first among equal logits; flipped, it is transformers'
        # ascending order, whose cumulative sum (the mass at or below a token) adds the small probabilities first.
        descending, order = torch.sort(scores, dim=-1, descending=True, stable=True)
        below = descending.flip(-1).softmax(-1).cumsum(-1).flip(-1)
        drop = below <= 1 - sampling.top_p
        drop[..., 0] = False  # the top token stays
        scores = scores.masked_fill(torch.zeros_like(drop).scatter_(-1, order, drop), -torch.inf)
    if sampling.min_p:
        probs = scores.softmax(-1)
        scores = scores.masked_fill(probs < sampling.min_p * probs.amax(-1, keepdim=True), -torch.inf)
    return scores


def logprobs_of(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """[S] float32: log_softmax(logits.float() / temperature, -1) at tokens ([S]), upcasting at most _VOCAB_CHUNK
    columns at a time: the row's max, the sum of exp(logit - max) chunk by chunk, and the token's logit - max -
    log(sum)."""

    def scaled(x: Tensor) -> Tensor:  # at temperature 1 no division: not one device op more than needed
        return x.float() if temperature == 1 else x.float() / temperature

    top = scaled(logits.amax(-1, keepdim=True))
    total = sum((scaled(chunk) - top).exp().sum(-1) for chunk in logits.split(_VOCAB_CHUNK, dim=-1))
    return (scaled(logits.gather(-1, tokens[:, None])) - top).squeeze(-1) - total.log()


def draw(logits: Tensor, sampling: Sampling, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(tokens [S] int64, their log-probabilities [S] float32 under the unfiltered model at the sampling temperature,
    1 when greedy), on the logits' device. Greedy: argmax (ties to the lowest index), the generator untouched.
    Sampled: an exponential race on the generator's device (the CPU's for reproducibility): with E_i ~ Exp(1),
    argmax_i (p_i / E_i) is token i with probability p_i / sum(p) exactly, taken in log space (filtered - log E)
    so that no probability underflows; torch.multinomial's one-sample path is the same race, less its host-side
    check of the probabilities."""
    if sampling.greedy:
        tokens = logits.argmax(-1)
    else:
        filtered = filtered_logits(logits, sampling).to(generator.device)
        race = torch.empty_like(filtered).exponential_(generator=generator)
        # An Exp(1) draw of 0 would make -inf - log(0) NaN, which argmax would pick: clamp to the smallest float.
        tokens = (filtered - race.clamp_min_(torch.finfo(torch.float32).tiny).log()).argmax(-1).to(logits.device)
    return tokens, logprobs_of(logits, tokens, sampling.temperature or 1.0)
