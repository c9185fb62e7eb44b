"""Measurements the dynamic checks are made of.

Teacher forcing: the verifier's own greedy continuation of each prompt is the
sequence greedy speculative decoding would commit, so a drafter's block at any
anchor of it is accepted exactly as far as it matches the next tokens.
Measuring at many anchors of a few continuations gives per-position acceptance
with far less decoding than real runs, and the *same* anchors serve every
counterfactual (aux layers shifted, chat template off): the differences are
paired, not noise between two decodes.  A short real decode through the
engine then checks that the drafter behaves the same in the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specui.algorithms.base import DraftContext, Drafter
from specui.trace import SamplingParams, StepTrace
from specui.verifier.batched import reference_greedy
from specui.verifier.model import Verifier


@dataclass
class Sample:
    """A prompt, its greedy continuation, and the verifier's taps at every layer."""

    prompt_len: int
    ids: torch.Tensor  # [T] prompt + continuation
    taps: torch.Tensor  # [T, num_layers + 1, H]
    agree: torch.Tensor  # [T] bool: ids[t] is the verifier's greedy token after ids[:t]

    def features(self, layer_ids: list[int]) -> torch.Tensor:
        """[T, len(layer_ids) * H]: what the engine hands a drafter conditioning on
        ``layer_ids``."""
        return self.taps[:, layer_ids].reshape(self.taps.shape[0], -1)


@dataclass
class Acceptance:
    """Per-position acceptance over blocks: a_k = blocks with >= k drafts accepted / blocks."""

    k: int
    lengths: list[int] = field(
        default_factory=list
    )  # accepted drafts of each block, in anchor order
    traces: list[list[StepTrace]] = field(default_factory=list)  # real_decode's steps, per prompt

    @property
    def anchors(self) -> int:
        return len(self.lengths)

    @property
    def per_position(self) -> list[float]:
        n = len(self.lengths)
        return (
            [sum(1 for x in self.lengths if x >= i) / n for i in range(1, self.k + 1)] if n else []
        )

    @property
    def tau(self) -> float:
        """Acceptance length 1 + sum_k a_k (the 1: the verifier's own token)."""
        return 1.0 + sum(self.per_position)

    def to_dict(self) -> dict:
        return {
            "anchors": self.anchors,
            "tau": round(self.tau, 4),
            "per_position": [round(a, 4) for a in self.per_position],
        }


_CACHE: dict[tuple, list[list[int]]] = {}  # greedy continuations by (weights, prompt, length)


def continuations(
    verifier: Verifier, prompts: list[list[int]], max_new_tokens: int
) -> list[list[int]]:
    """The verifier's greedy continuations (batched; remembered for this process: the
    counterfactuals, the CLI's --vllm and a test suite all reuse them)."""
    keys = [(verifier.fingerprint, tuple(p), max_new_tokens) for p in prompts]
    todo = [p for p, key in zip(prompts, keys, strict=True) if key not in _CACHE]
    if todo:
        for p, cont in zip(todo, reference_greedy(verifier, todo, max_new_tokens), strict=True):
            _CACHE[(verifier.fingerprint, tuple(p), max_new_tokens)] = list(cont)
    return [_CACHE[key] for key in keys]


def sample(verifier: Verifier, prompt: list[int], continuation: list[int]) -> Sample:
    """``prompt + continuation`` run once through the verifier: taps of every layer and
    where the continuation is the verifier's greedy choice (a batched generation's padding
    may round an argmax the other way; a continuation after another prompt may differ)."""
    layers = list(range(verifier.num_layers + 1))
    seq = torch.tensor([*prompt, *continuation], dtype=torch.long)
    fwd = verifier.forward(seq, None, layers, logits=True)
    agree = torch.zeros(len(seq), dtype=torch.bool)
    agree[1:] = fwd.logits[:-1].argmax(-1) == seq[1:]
    taps = fwd.aux_hidden.view(len(seq), len(layers), verifier.hidden_size)
    return Sample(prompt_len=len(prompt), ids=seq, taps=taps, agree=agree)


def greedy_samples(
    verifier: Verifier, prompts: list[list[int]], max_new_tokens: int
) -> list[Sample]:
    """A ``Sample`` of each prompt with its greedy continuation."""
    conts = continuations(verifier, prompts, max_new_tokens)
    return [sample(verifier, p, c) for p, c in zip(prompts, conts, strict=True)]


def anchors_of(s: Sample, k: int, per_sample: int) -> list[int]:
    """Up to ``per_sample`` evenly spaced anchors of the continuation with k tokens after them."""
    first, last = s.prompt_len - 1, len(s.ids) - 1 - k
    if last < first:
        return []
    n = last - first + 1
    step = max(1, n // per_sample)
    return list(range(first, last + 1, step))[:per_sample]


@torch.inference_mode()
def teacher_forced(
    drafter: Drafter, samples: list[Sample], layer_ids: list[int], per_sample: int
) -> Acceptance:
    """Per-position acceptance of ``drafter`` fed the taps of ``layer_ids`` at the anchors of
    ``samples`` (greedy: a draft is accepted while it equals the continuation)."""
    k = drafter.num_speculative_tokens
    acc = Acceptance(k)
    greedy = SamplingParams()
    for s in samples:
        feats = s.features(layer_ids)
        # anchors only move forward within a sample: the drafter's cache stays valid
        drafter.reset()
        for a in anchors_of(s, k, per_sample):
            ctx = DraftContext(
                token_ids=s.ids[: a + 1], features=feats[:a], sampling=greedy, generator=None
            )
            drafts = drafter.propose(ctx).token_ids
            truth, ok = (
                s.ids[a + 1 : a + 1 + len(drafts)].tolist(),
                s.agree[a + 1 : a + 1 + len(drafts)].tolist(),
            )
            # Accepted while the draft is the next token and that token is the verifier's greedy
            # one.
            n = next(
                (i for i, d in enumerate(drafts) if i >= len(truth) or d != truth[i] or not ok[i]),
                len(drafts),
            )
            acc.lengths.append(n)
    return acc


def real_decode(
    verifier: Verifier, drafter: Drafter, prompts: list[list[int]], max_new_tokens: int
) -> Acceptance:
    """Per-position acceptance of greedy decoding through the engine itself."""
    from specui.engine import generate

    acc = Acceptance(drafter.num_speculative_tokens)
    for p in prompts:
        steps = generate(verifier, drafter, p, max_new_tokens=max_new_tokens, seed=0).steps
        acc.lengths += [s.num_accepted for s in steps if s.num_drafted > 0]
        acc.traces.append(steps)
    return acc
