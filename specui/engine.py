"""The decoding loop every drafter plugs into: draft -> verify -> accept/reject -> bonus.

One generation keeps three things in step:

* ``committed``  -- prompt + output tokens.  The last one was emitted by the
  verifier and has not been run through it yet: it opens the next block.
* the verifier's KV cache -- every committed position but the last.
* ``features``   -- the verifier's aux taps at those same positions, for drafters
  that condition on hidden states.

A step runs the block ``[last, d_1 .. d_k]`` through the verifier in one pass,
accepts a prefix ``d_1 .. d_n`` and draws one more token from the verifier: the
*bonus* token when all ``k`` were accepted, else the *corrected* token that
replaces ``d_{n+1}``.  The cache is cropped back to ``last, d_1 .. d_n`` (no
recomputation of the accepted prefix) and their taps are appended.

Acceptance (Leviathan et al. 2023; Chen et al. 2023): accept ``d_i`` with
probability ``min(1, p_i(d_i) / q_i(d_i))``; on rejection draw from
``norm(max(0, p_i - q_i))``.  Greedy is the special case where p is one-hot on
the verifier's argmax, so it accepts the longest matching prefix.  Either way
the output has exactly the verifier's distribution, whatever the drafter does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch

from specui.algorithms.base import DraftContext, Drafter
from specui.errors import SpecUIError
from specui.policy import Decision, FixedPolicy, Policy
from specui.sampling import process_logits, sample
from specui.trace import FinalTokenKind, GenerationResult, SamplingParams, StepTrace
from specui.verifier.model import Verifier


def accept_drafts(
    draft_ids: list[int],
    p: torch.Tensor,
    q: torch.Tensor | None,
    generator: torch.Generator | None,
) -> tuple[int, int, FinalTokenKind]:
    """Speculative sampling over one block.

    ``p``: the verifier's processed distributions ``[k+1, V]`` (row i is the
    distribution of the token after ``d_i``'s predecessor); ``q``: the drafter's
    ``[k, V]`` or ``None`` for a deterministic proposal (q one-hot on ``d_i``).
    Returns (accepted count n, final token, its kind).
    """
    for i, token in enumerate(draft_ids):
        p_tok = float(p[i, token])
        q_tok = float(q[i, token]) if q is not None else 1.0
        u = float(torch.rand((), generator=generator))
        # u < p/q, written without the division (q_tok > 0 for a drawn token).
        if q_tok > 0 and u * q_tok < p_tok:
            continue
        if q is not None:
            residual = (p[i] - q[i]).clamp_min(0)
        else:
            residual = p[i].clone()
            residual[token] = 0.0
        total = float(residual.sum())
        # total == 0 only if p == q up to rounding, where rejection cannot happen
        # in exact arithmetic; fall back to p itself.
        dist = residual / total if total > 1e-12 else p[i]
        return i, sample(dist, generator), FinalTokenKind.CORRECTED
    k = len(draft_ids)
    return k, sample(p[k], generator), FinalTokenKind.BONUS


def accept_greedy(
    draft_ids: list[int], logits: torch.Tensor
) -> tuple[int, int, FinalTokenKind, list[float]]:
    """``accept_drafts`` at temperature 0, read from the verifier's argmaxes alone.

    Greedy p is one-hot on each row's argmax, so the rule accepts the longest prefix that
    matches them and the final token is the next argmax: the same result without building
    and reading ``[k+1, V]`` one-hot rows (a millisecond a step on a 49k vocabulary).
    Returns (accepted count n, final token, its kind, p(d_i) for each drafted token).
    """
    best = logits.argmax(-1).tolist()
    target_probs = [1.0 if best[i] == t else 0.0 for i, t in enumerate(draft_ids)]
    for i, token in enumerate(draft_ids):
        if best[i] != token:
            return i, best[i], FinalTokenKind.CORRECTED, target_probs
    return len(draft_ids), best[len(draft_ids)], FinalTokenKind.BONUS, target_probs


class Rows:
    """The verifier taps of the committed positions, grown in place (doubling): appending a
    step's rows copies them only, not every earlier row as a ``cat`` would (a few hundred KB a
    step at a few hundred tokens, which a plain step of a policy that stopped drafting pays for
    nothing).  Rows already handed out are never written again."""

    def __init__(self, width: int) -> None:
        self.buffer = torch.empty(64, width)
        self.length = 0

    def append(self, rows: torch.Tensor) -> torch.Tensor:
        """Add ``rows`` [n, width]; returns every row so far (a view)."""
        end = self.length + rows.shape[0]
        if end > self.buffer.shape[0]:
            grown = torch.empty(max(end, 2 * self.buffer.shape[0]), self.buffer.shape[1])
            grown[: self.length] = self.buffer[: self.length]
            self.buffer = grown
        self.buffer[self.length : end] = rows
        self.length = end
        return self.buffer[:end]


class Decoding:
    """One generation, iterated step by step; ``result`` is filled at the end.

    >>> run = Decoding(verifier, drafter, prompt_ids, max_new_tokens=64)
    >>> for step in run: show(step)
    >>> run.result.acceptance_length
    """

    def __init__(
        self,
        verifier: Verifier,
        drafter: Drafter,
        prompt_ids: list[int],
        *,
        max_new_tokens: int = 128,
        sampling: SamplingParams | None = None,
        seed: int | None = None,
        stop_strings: tuple[str, ...] | list[str] = (),
        stop_on_eos: bool = True,
        should_stop: Callable[[], bool] | None = None,
        policy: Policy | None = None,
    ) -> None:
        """``policy`` decides how many drafts each step sends (``specui.policy``; None: every
        draft, ``FixedPolicy``).  One policy may serve a run's prompts in turn: it learns the
        drafter's acceptance over them."""
        if not prompt_ids:
            raise SpecUIError("the prompt is empty")
        if max_new_tokens < 1:
            raise SpecUIError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if len(prompt_ids) >= verifier.max_context:
            raise SpecUIError(
                f"the prompt has {len(prompt_ids)} tokens; the verifier's context window is"
                f" {verifier.max_context}"
            )
        if any(not 0 <= t < verifier.vocab_size for t in prompt_ids):
            raise SpecUIError(f"prompt token ids must lie in 0..{verifier.vocab_size - 1}")
        k = drafter.num_speculative_tokens
        if k < 0 or k > 256:
            raise SpecUIError(f"number of speculative tokens must be in 0..256, got {k}")
        self.verifier = verifier
        self.drafter = drafter
        self.prompt_ids = list(prompt_ids)
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling or SamplingParams()
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.eos_ids = verifier.eos_token_ids if stop_on_eos else set()
        self.should_stop = should_stop
        self.policy: Policy = policy or FixedPolicy()
        # The cost model is measured (or read) here, before the run's clock starts.
        self.policy.start(verifier, drafter)
        # Separate streams: the drafter's draws must not shift the verifier's.
        base = seed if seed is not None else torch.seed()
        self.verify_gen = torch.Generator().manual_seed(base)
        self.draft_gen = torch.Generator().manual_seed(base + 1)
        self.result = GenerationResult(
            prompt_token_ids=self.prompt_ids,
            output_token_ids=[],
            output_text="",
            num_speculative_tokens=k,
        )

    def __iter__(self) -> Iterator[StepTrace]:
        v, drafter = self.verifier, self.drafter
        aux_ids = drafter.aux_layer_ids
        if aux_ids:
            v.check_aux_layer_ids(aux_ids)
        start = time.perf_counter()
        drafter.reset()
        committed = torch.tensor(self.prompt_ids, dtype=torch.long)
        cache = self.cache = v.new_cache()  # kept on self so tests can inspect it
        features: torch.Tensor | None = None
        if aux_ids:
            self._taps = Rows(len(aux_ids) * v.hidden_size)
        if len(self.prompt_ids) > 1:  # prefill all but the last prompt token
            out = v.forward(committed[:-1], cache, aux_ids, logits=False)
            if aux_ids:
                features = self._taps.append(out.aux_hidden)
        elif aux_ids:
            features = self._taps.append(torch.zeros(0, len(aux_ids) * v.hidden_size))
        self.prefill_time_s = (
            time.perf_counter() - start
        )  # benches separate decoding from the prompt
        output: list[int] = []
        res = self.result
        step = 0
        try:
            while True:
                if self.should_stop is not None and self.should_stop():
                    res.stop_reason = "cancelled"
                    break
                room = min(self.max_new_tokens - len(output), v.max_context - len(committed))
                if room <= 0:
                    res.stop_reason = (
                        "max_tokens" if len(output) >= self.max_new_tokens else "context"
                    )
                    break
                # Drafting more than room-1 tokens is wasted work (the final token adds one).
                t0 = time.perf_counter()
                decision = self._propose(committed, features, max_k=room - 1)
                proposal = decision.proposal
                t1 = time.perf_counter()
                block = torch.cat(
                    [committed[-1:], torch.tensor(proposal.token_ids, dtype=torch.long)]
                )
                out = v.forward(block, cache, aux_ids)
                if self.sampling.greedy:
                    n, final, kind, target_probs = accept_greedy(proposal.token_ids, out.logits)
                else:
                    p = process_logits(out.logits, self.sampling)
                    n, final, kind = accept_drafts(
                        proposal.token_ids, p, proposal.probs, self.verify_gen
                    )
                    target_probs = [float(p[i, t]) for i, t in enumerate(proposal.token_ids)]
                t2 = time.perf_counter()
                # Keep only `last, d_1..d_n` in the cache and in the features.
                v.crop(cache, len(committed) + n)
                if aux_ids:
                    features = self._taps.append(out.aux_hidden[: n + 1])
                emitted = proposal.token_ids[:n] + [final]
                emitted, reason = self._apply_stops(output, emitted)
                self.policy.observe(decision, n, len(emitted))
                committed = self.committed = torch.cat(
                    [committed, torch.tensor(emitted, dtype=torch.long)]
                )
                output.extend(emitted)
                context_len = len(committed) - len(emitted)
                verified = (target_probs, n, final, kind, emitted)
                trace = self._trace(step, context_len, decision, *verified, t1 - t0, t2 - t1)
                res.steps.append(trace)
                step += 1
                yield res.steps[-1]
                if reason:
                    res.stop_reason = reason
                    break
        finally:
            res.output_token_ids = output
            res.output_text = self._text(output)
            res.wall_time_s = time.perf_counter() - start

    def _propose(
        self, committed: torch.Tensor, features: torch.Tensor | None, max_k: int
    ) -> Decision:
        ctx = DraftContext(
            token_ids=committed, features=features, sampling=self.sampling, generator=self.draft_gen
        )
        return self.policy.propose(ctx, self.drafter, max_k)

    def _apply_stops(self, output: list[int], emitted: list[int]) -> tuple[list[int], str | None]:
        """Cut ``emitted`` at EOS, the token budget or a stop string."""
        for i, tok in enumerate(emitted):
            if tok in self.eos_ids:
                return emitted[: i + 1], "eos"
        budget = self.max_new_tokens - len(output)
        reason = None
        if len(emitted) >= budget:
            emitted, reason = emitted[:budget], "max_tokens"
        if self.stop_strings and self._has_stop(output + emitted):
            # Keep the fewest tokens whose text contains a stop string.
            for i in range(1, len(emitted) + 1):
                if self._has_stop(output + emitted[:i]):
                    return emitted[:i], "stop_string"
        return emitted, reason

    def _has_stop(self, ids: list[int]) -> bool:
        text = self._raw_text(ids)
        return any(s in text for s in self.stop_strings)

    def _raw_text(self, ids: list[int]) -> str:
        tok = self.verifier.tokenizer
        return (
            self.verifier.decode(ids) if tok is None else tok.decode(ids, skip_special_tokens=True)
        )

    def _text(self, ids: list[int]) -> str:
        """The output text, ending before the first stop string."""
        text = self._raw_text(ids)
        for s in self.stop_strings:
            if s in text:
                text = text[: text.index(s)]
        return text

    def _trace(
        self, step, context_len, decision, target_probs, n, final, kind, emitted, draft_s, verify_s
    ) -> StepTrace:
        v = self.verifier
        proposal = decision.proposal
        ids = proposal.token_ids
        q = proposal.probs
        return StepTrace(
            step=step,
            context_len=context_len,
            draft_token_ids=list(ids),
            draft_texts=[v.token_text(t) for t in ids],
            draft_probs=[float(q[i, t]) if q is not None else 1.0 for i, t in enumerate(ids)],
            target_probs=target_probs,
            confidences=list(proposal.confidences) if proposal.confidences is not None else None,
            num_accepted=n,
            final_token_id=final,
            final_token_text=v.token_text(final),
            final_token_kind=kind,
            emitted_token_ids=list(emitted),
            draft_time_s=draft_s,
            verify_time_s=verify_s,
            proposer=decision.proposer,
            unsent_token_ids=list(decision.unsent),
            unsent_texts=[v.token_text(t) for t in decision.unsent],
        )


def generate(
    verifier: Verifier, drafter: Drafter, prompt_ids: list[int], **kwargs
) -> GenerationResult:
    """Run a whole generation (see ``Decoding`` for the arguments)."""
    run = Decoding(verifier, drafter, prompt_ids, **kwargs)
    for _ in run:
        pass
    return run.result
