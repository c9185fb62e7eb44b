"""Turning logits into the distribution tokens are drawn from.

The verifier's p and every drafter's q go through ``process_logits`` with the
same settings: speculative sampling is lossless for the *processed* target
distribution only if both sides are processed identically.
"""

from __future__ import annotations

import torch

from specui.trace import SamplingParams


def process_logits(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Logits ``[..., V]`` -> probabilities ``[..., V]`` (float32).

    Greedy (temperature 0) gives a one-hot on the argmax, so greedy decoding is
    the same acceptance rule with a deterministic target.
    """
    logits = logits.float()
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p: a token stays if the
        # mass strictly before it is still short of top_p.
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        keep_sorted = before < sampling.top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = probs * keep
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from a 1-D distribution.

    A one-hot distribution (greedy decoding's) allows one token: it is returned without a
    draw, since ``multinomial`` over a 49k vocabulary costs ~1 ms, ~6% of a plain step.
    """
    top = int(probs.argmax())
    if float(probs[top]) == 1.0:
        return top
    return int(torch.multinomial(probs, 1, generator=generator))


def choose(
    probs: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
) -> torch.Tensor:
    """Token per row of ``probs [k, V]``: argmax when greedy, else a sample."""
    if sampling.greedy:
        return probs.argmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
