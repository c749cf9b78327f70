"""preference/logps.py: the labels' log-probabilities a chunk of positions at a time, against torchtitan's own
`compute_logprobs` (its RL losses' log-probabilities and entropy) and against the whole window at once.

Run: .venv/bin/python -m pytest tests/test_logps.py -q
"""

import pytest
import torch
from torchtitan.components.loss import IGNORE_INDEX, compute_logprobs

from neuron_qwen3.preference.logps import token_logps

B, L, D, V = 2, 7, 16, 50


def assert_close(found, expected):
    """Within 1e-6 of the expected tensor's norm: float32's rounding where a chunk's matmul sums in another order."""
    assert (found - expected).norm() <= 1e-6 * expected.norm(), ((found - expected).abs().max(), expected.norm())


def inputs(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, L, D, generator=generator, requires_grad=True)
    head = torch.nn.Linear(D, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, D, generator=generator))
    labels = torch.randint(0, V, (B, L), generator=generator)
    labels[0, :2] = labels[1, -1] = IGNORE_INDEX
    return hidden, head, labels


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_values_and_entropy_are_torchtitans(temperature):
    hidden, head, labels = inputs()
    picked, entropy = token_logps(hidden, labels, temperature, head, entropy=True, tokens=3 * B)
    theirs, their_entropy = compute_logprobs(head(hidden) / temperature, labels, return_entropy=True)
    assert_close(picked, theirs)
    assert_close(entropy, their_entropy)
    assert not entropy.requires_grad and picked.requires_grad


@pytest.mark.parametrize("positions", [1, 3, 5, L])
@pytest.mark.parametrize("with_head", [True, False])
def test_chunks_give_the_whole_windows_values_and_gradients(positions, with_head):
    """Any chunking (uneven ones too) gives what one chunk of the whole window gives: the log-probabilities, and
    the gradients of a weighted sum of them into the hidden states and the lm_head's weight (or the logits)."""
    found = []
    for chunk in (L, positions):
        hidden, head, labels = inputs()
        out = hidden if with_head else head(hidden).detach().requires_grad_(True)
        picked, _ = token_logps(out, labels, 0.9, head if with_head else None, tokens=chunk * B)
        (picked * torch.linspace(-1, 2, L)).sum().backward()
        found.append((picked.detach(), out.grad, head.weight.grad))
    (whole, whole_out, whole_weight), (chunked, chunked_out, chunked_weight) = found
    assert_close(chunked, whole)
    assert_close(chunked_out, whole_out)
    if with_head:
        assert_close(chunked_weight, whole_weight)
    assert (whole[inputs()[2] == IGNORE_INDEX] == 0).all() and (whole[inputs()[2] != IGNORE_INDEX] < 0).all()


def test_the_backward_keeps_no_vocabulary_wide_tensor():
    """What autograd saves for the backward: the chunks' inputs, never a [B, positions, V] logits or log-softmax
    (the backward recomputes one chunk's at a time)."""
    hidden, head, labels = inputs()
    saved = []

    def pack(tensor):
        saved.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        picked, _ = token_logps(hidden, labels, 1.0, head, tokens=3 * B)
    assert not [shape for shape in saved if shape[-1] == V], saved
    picked.sum().backward()
    assert hidden.grad is not None and head.weight.grad is not None


def test_without_gradients_nothing_is_checkpointed():
    hidden, head, labels = inputs()
    with torch.no_grad():
        picked, entropy = token_logps(hidden, labels, 1.0, head, entropy=True, tokens=2 * B)
    assert not picked.requires_grad and entropy.shape == (B, L)
