"""generate/sampling.py: the draws follow the filtered distribution (a chi-square test against a kept set computed
here by sorting), the filters equal transformers' warpers, greedy is argmax without touching the generator, the
log-probabilities are log_softmax(logits.float()), a seed and a saved generator state reproduce the draws, and bad
settings are refused.
Run: .venv/bin/python -m pytest tests/test_generate_sampling.py -q
"""

import math

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from neuron_qwen3.generate import sampling
from neuron_qwen3.generate.sampling import Sampling, draw, filtered_logits, logprobs_of

SAMPLES = 10_000
P_VALUE = 0.001  # a fixed seed makes the test deterministic; this only sets how far from the expectation it may be


def chi2_sf(x: float, dof: int) -> float:
    """P(X > x) for X ~ chi-square(dof), i.e. the regularized upper gamma Q(dof / 2, x / 2), from Q(1, y) = e^-y
    (dof even) or Q(1/2, y) = erfc(sqrt(y)) (dof odd) by Q(a + 1, y) = Q(a, y) + y^a e^-y / Gamma(a + 1)
    (Abramowitz & Stegun 6.5.21 and 26.4.4-5): exact for whole dof, as scipy.stats.chi2.sf (scipy is not installed)."""
    y = x / 2
    a, q = (1.0, math.exp(-y)) if dof % 2 == 0 else (0.5, math.erfc(math.sqrt(y)))
    while a < dof / 2:
        q += math.exp(a * math.log(y) - y - math.lgamma(a + 1))
        a += 1
    return q


def test_chi2_sf_matches_tables():
    # The 0.999 quantiles of the chi-square distribution (NIST/SEMATECH e-Handbook, table 1.3.6.7.4).
    for dof, quantile in ((1, 10.828), (2, 13.816), (3, 16.266), (4, 18.467), (9, 27.877), (10, 29.588)):
        assert chi2_sf(quantile, dof) == pytest.approx(0.001, rel=2e-3)


def kept_distribution(row: np.ndarray, s: Sampling) -> np.ndarray:
    """softmax(row / T) on the kept set, renormalised, 0 elsewhere: each filter by sorting, in float64."""
    probs = np.exp(row / s.temperature - (row / s.temperature).max())
    probs /= probs.sum()
    order = [int(i) for i in np.argsort(-probs, kind="stable")]
    kept = order if not s.top_k else order[: s.top_k]
    if s.top_p < 1:  # the smallest prefix of the most probable whose mass reaches top_p
        mass, total = [], probs[kept].sum()
        for i in kept:
            mass.append(i)
            if probs[mass].sum() / total >= s.top_p:
                break
        kept = mass
    if s.min_p:
        kept = [i for i in kept if probs[i] >= s.min_p * probs[kept[0]]]
    expected = np.zeros_like(probs)
    expected[kept] = probs[kept] / probs[kept].sum()
    return expected


CHI2_SETTINGS = [
    Sampling(temperature=0.7, top_k=5),
    Sampling(temperature=1.0, top_p=0.8),
    Sampling(temperature=1.3, min_p=0.1),
    Sampling(temperature=0.9, top_k=6, top_p=0.9, min_p=0.1),  # 5 kept: 6 without top-k or without top-p
]


@pytest.mark.parametrize("s", CHI2_SETTINGS, ids=str)
def test_draws_follow_the_filtered_distribution(s):
    row = torch.randn(32, generator=torch.Generator().manual_seed(0), dtype=torch.float64).float() * 1.5
    expected = kept_distribution(row.double().numpy(), s)
    kept = expected > 0
    assert 2 <= kept.sum() < len(row), "the setting should filter, and leave a choice"
    assert (SAMPLES * expected[kept]).min() >= 5, "too few expected draws in a cell for the chi-square test"

    tokens, _ = draw(row.expand(SAMPLES, -1), s, torch.Generator().manual_seed(1234))
    counts = np.bincount(tokens.numpy(), minlength=len(row))
    assert counts[~kept].sum() == 0, f"draws outside the kept set: {np.flatnonzero(counts * ~kept)}"
    statistic = ((counts[kept] - SAMPLES * expected[kept]) ** 2 / (SAMPLES * expected[kept])).sum()
    p = chi2_sf(statistic, int(kept.sum()) - 1)
    assert p > P_VALUE, f"chi-square {statistic:.1f} on {kept.sum() - 1} dof: p = {p:.2g}"


def transformers_filtered(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The warpers that transformers' generate chains for these settings, in its order."""
    warpers = LogitsProcessorList()
    if s.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(float(s.temperature)))
    if s.top_k:
        warpers.append(TopKLogitsWarper(top_k=s.top_k))
    if s.top_p < 1:
        warpers.append(TopPLogitsWarper(top_p=s.top_p))
    if s.min_p:
        warpers.append(MinPLogitsWarper(min_p=s.min_p))
    return warpers(None, logits.float())


@pytest.mark.parametrize(
    "s",
    [
        Sampling(temperature=1.0),
        Sampling(temperature=0.6, top_k=40),
        Sampling(temperature=1.0, top_p=0.9),
        Sampling(temperature=0.8, top_p=0.5),
        Sampling(temperature=1.5, min_p=0.05),
        Sampling(temperature=0.7, top_k=50, top_p=0.95),
        Sampling(temperature=0.6, top_k=20, top_p=0.95, min_p=0.1),
        Sampling(temperature=1.2, top_k=2000, top_p=0.3, min_p=0.02),
    ],
    ids=str,
)
def test_filtered_logits_equal_transformers_warpers(s):
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(16, 1000, generator=gen) * 3
    ours, theirs = filtered_logits(logits, s), transformers_filtered(logits, s)
    assert ours.dtype == torch.float32 and ours.shape == logits.shape
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    assert torch.allclose(ours[~torch.isinf(ours)], theirs[~torch.isinf(theirs)])
    assert torch.isinf(ours).any() or s == Sampling(temperature=1.0)

    # bfloat16 logits tie often, and where top-p ends inside a run of equal logits the two keep different ones of
    # them (the lowest indices here, transformers' sort order there): the same number of the same values.
    logits = (torch.randn(64, 1000, generator=gen) * 3).bfloat16()
    ours, theirs = filtered_logits(logits, s), transformers_filtered(logits, s)
    for row in range(len(logits)):
        kept, kept_theirs = ours[row][~torch.isinf(ours[row])], theirs[row][~torch.isinf(theirs[row])]
        assert torch.equal(kept.sort().values, kept_theirs.sort().values)
        if s.top_p == 1:
            assert torch.equal(torch.isinf(ours[row]), torch.isinf(theirs[row]))


def test_ties_and_a_tiny_nucleus():
    # top-k keeps every token tied with the k-th logit, as transformers does
    logits = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0]])
    s = Sampling(temperature=1.0, top_k=2)
    assert torch.equal(torch.isinf(filtered_logits(logits, s)), torch.isinf(transformers_filtered(logits, s)))
    assert torch.isinf(filtered_logits(logits, s)).tolist() == [[True, False, False, False, True]]
    # top-p ending inside a run of equal logits keeps the lowest indices; greedy picks the lowest index
    uniform = torch.zeros(1, 4)
    assert torch.isinf(filtered_logits(uniform, Sampling(1.0, top_p=0.5))).tolist() == [[False, False, True, True]]
    assert torch.isinf(filtered_logits(uniform, Sampling(1.0, top_p=1e-6))).tolist() == [[False, True, True, True]]
    assert draw(uniform, Sampling(), torch.Generator())[0].tolist() == [0]
    # a nucleus so small that a row's total probability rounds to at most 1 - top_p: the top token alone stays
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(2))
    only = filtered_logits(logits, Sampling(1.0, top_p=1e-9))
    assert torch.equal(only.argmax(-1), logits.argmax(-1)) and (~torch.isinf(only)).sum(-1).eq(1).all()


def test_greedy_is_argmax_and_leaves_the_generator_alone():
    logits = torch.randn(8, 500, generator=torch.Generator().manual_seed(3)).bfloat16()
    for s in (Sampling(), Sampling(temperature=0.0, top_k=3, top_p=0.5, min_p=0.2)):
        assert s.greedy
        gen = torch.Generator().manual_seed(11)
        state = gen.get_state()
        tokens, _ = draw(logits, s, gen)
        assert tokens.dtype == torch.int64 and torch.equal(tokens, logits.argmax(-1))
        assert torch.equal(gen.get_state(), state)
        point_mass = filtered_logits(logits, s)
        assert torch.equal(point_mass.argmax(-1), tokens) and (~torch.isinf(point_mass)).sum(-1).eq(1).all()
    assert not Sampling(temperature=0.5).greedy


@pytest.mark.parametrize("s", [Sampling(), Sampling(temperature=0.7, top_k=30, top_p=0.9)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_are_the_unfiltered_models_at_the_temperature(s, dtype, monkeypatch):
    monkeypatch.setattr(sampling, "_VOCAB_CHUNK", 256)  # 1,000 columns upcast in four chunks
    logits = (torch.randn(4, 1000, generator=torch.Generator().manual_seed(5)) * 4).to(dtype)
    tokens, logps = draw(logits, s, torch.Generator().manual_seed(0))
    reference = torch.log_softmax(logits.float() / (s.temperature or 1), -1).gather(-1, tokens[:, None]).squeeze(-1)
    assert logps.dtype == torch.float32 and logps.shape == (4,)
    assert torch.allclose(logps, reference, rtol=0, atol=1e-6), (logps - reference).abs().max()


def test_logprobs_over_a_large_vocabulary():
    # 151,936 columns (Qwen3's vocabulary), in five chunks of the module's own size: within 1e-6 of the float64
    # log-softmax, where torch's float32 log_softmax on the CPU is about 1e-5 off at this width.
    logits = (torch.randn(4, 151_936, generator=torch.Generator().manual_seed(5)) * 4).bfloat16()
    tokens = torch.tensor([0, 1, 151_935, int(logits[3].float().argmax())])
    exact = torch.log_softmax(logits.double(), -1).gather(-1, tokens[:, None]).squeeze(-1)
    assert torch.allclose(logprobs_of(logits, tokens).double(), exact, rtol=0, atol=1e-6)


def test_a_seed_and_a_saved_state_reproduce_the_draws():
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(9)) * 2
    s = Sampling(temperature=1.0, top_p=0.95)

    def run(gen, steps):
        return [draw(logits, s, gen)[0] for _ in range(steps)]

    first, again = run(torch.Generator().manual_seed(42), 4), run(torch.Generator().manual_seed(42), 4)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, first[0]) for a in first[1:]), "successive draws should differ"
    assert not torch.equal(first[0], run(torch.Generator().manual_seed(43), 1)[0])

    gen = torch.Generator().manual_seed(42)
    run(gen, 2)
    saved = gen.get_state()  # a checkpoint after two steps
    resumed = torch.Generator()
    resumed.set_state(saved)
    assert all(torch.equal(a, b) for a, b in zip(run(resumed, 2), first[2:]))


@pytest.mark.parametrize(
    "kwargs, field, value",
    [
        ({"temperature": -0.5}, "temperature", "-0.5"),
        ({"temperature": float("nan")}, "temperature", "nan"),
        ({"top_k": -1}, "top_k", "-1"),
        ({"top_k": 2.5}, "top_k", "2.5"),
        ({"top_p": 0.0}, "top_p", "0.0"),
        ({"top_p": 1.5}, "top_p", "1.5"),
        ({"min_p": -0.1}, "min_p", "-0.1"),
        ({"min_p": 1.0}, "min_p", "1.0"),
    ],
)
def test_bad_settings_are_refused(kwargs, field, value):
    with pytest.raises(ValueError, match=rf"{field}={value}\b.*{field}") as refused:
        Sampling(**kwargs)
    assert "\n" not in str(refused.value)
