"""Replaying a stored run step by step: what the Playground's *Replay a stored
run* and ``specui runs replay`` show.

A local run stored every ``StepTrace`` as the engine produced it, so its replay
is exactly what live decoding showed.  A vLLM run stored only what vLLM
reports (see ``specui.vllm.request_steps``): per step the number drafted and accepted;
the accepted drafts are the emitted tokens, while rejected draft tokens and
all probabilities are unknown (id -1, text ``?``, NaN).  Where vLLM gave only a
per-request histogram of accepted counts, the stored steps have the right
counts in an invented order, and the replay says so: ``StepSource`` carries
what is known about where the steps came from, in words for the UI and CLI.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from specui.store import Backend, PromptResult, Run, Store, user_error
from specui.trace import GenerationResult, StepTrace

MAX_STEPS_PER_S = 100.0


@dataclass(frozen=True)
class StepSource:
    """Where a run's stored steps came from."""

    key: str  # local | per_step | histogram | mixed | tokens | plain | unknown
    real_order: bool  # the steps are in the order they happened
    drafts_known: bool  # every drafted token (and its probabilities) is known
    note: str  # one paragraph for the UI / CLI

    @property
    def label(self) -> str:
        return _LABELS.get(self.key, self.key)


_LABELS = {
    "local": "SpecUI engine trace",
    "per_step": "vLLM per-step counts",
    "histogram": "vLLM per-request histogram",
    "mixed": "vLLM per-step counts and histograms",
    "tokens": "vLLM output tokens only",
    "plain": "vLLM without a speculator",
    "unknown": "vLLM (origin not recorded)",
}

_UNKNOWN_DRAFTS = (
    "vLLM reports how many tokens were drafted and accepted, not the rejected draft tokens "
    "nor any probabilities: accepted drafts are shown as the tokens vLLM emitted, rejected "
    "and discarded slots as “?”."
)


def step_source(run: Run) -> StepSource:
    """What is known about ``run``'s stored steps (from the backend and the
    ``vllm.measured.step_source`` the vLLM benchmark records)."""
    if run.backend == Backend.LOCAL:
        return StepSource(
            "local",
            True,
            True,
            "Recorded by SpecUI's engine: every draft token, its probabilities "
            "and the step times exactly as decoded.",
        )
    measured = (run.settings.get("vllm") or {}).get("measured") or {}
    parts = set(str(measured.get("step_source") or "unknown").split("+"))
    if parts == {"per_step"}:
        return StepSource(
            "per_step",
            True,
            False,
            "Steps from vLLM's per-step acceptance counts, in the order they "
            "happened. " + _UNKNOWN_DRAFTS,
        )
    if parts == {"histogram"}:
        return StepSource(
            "histogram",
            False,
            False,
            "NOT the real per-step order: vLLM reported only a per-request histogram of accepted"
            " counts, so these steps have the right counts (τ and a_k are exact) but their order,"
            " and which tokens each step emitted, is invented (fewest accepted first). "
            + _UNKNOWN_DRAFTS,
        )
    if "histogram" in parts:
        return StepSource(
            "mixed",
            False,
            False,
            "Some requests of this run had vLLM's per-step counts, others only "
            "a per-request histogram; a histogram request's steps are NOT in their real order "
            "(right counts, invented order). " + _UNKNOWN_DRAFTS,
        )
    if parts == {"plain"}:
        return StepSource(
            "plain",
            True,
            True,
            "vLLM served the verifier without a speculator: one token per step, nothing drafted.",
        )
    if parts == {"tokens"}:
        return StepSource(
            "tokens",
            False,
            True,
            "vLLM reported no acceptance data for this run: each output token "
            "is shown as its own step, which is not how it was decoded.",
        )
    return StepSource(
        "unknown",
        False,
        False,
        "This vLLM run does not record where its steps came from (it may be "
        "from an older SpecUI): treat their order as unknown. " + _UNKNOWN_DRAFTS,
    )


@dataclass
class Replay:
    """One request of a stored run, ready to play back."""

    run: Run
    prompt_index: int
    prompt_text: str
    steps: list[StepTrace]
    source: StepSource
    num_speculative_tokens: int
    stop_reason: str | None  # None: the request never finished (a stopped or dead run)
    wall_time_s: float | None

    def result(self, n: int | None = None) -> GenerationResult:
        """The first ``n`` steps (all by default) as a ``GenerationResult``, so
        tau, a_k and the renderers work on a replay as on live decoding."""
        steps = self.steps if n is None else self.steps[:n]
        done = n is None or n >= len(self.steps)
        return GenerationResult(
            prompt_token_ids=[],  # not stored; nothing shown needs it
            output_token_ids=[t for s in steps for t in s.emitted_token_ids],
            output_text="",
            steps=list(steps),
            stop_reason=(self.stop_reason or "unfinished") if done else "replaying",
            wall_time_s=(self.wall_time_s or 0.0) if done else 0.0,
            num_speculative_tokens=self.num_speculative_tokens,
        )


def replay_runs(store: Store, limit: int = 50) -> list[Run]:
    """The newest runs that stored at least one step (the ones worth replaying)."""
    runs = store.list_runs(limit=limit)
    counts = store.count_results([r.id for r in runs if r.id is not None])
    return [r for r in runs if r.id is not None and counts[r.id][1] > 0]


def run_label(run: Run) -> str:
    """One line naming a run in a dropdown: id, backend, drafter, prompt set."""
    return f"#{run.id} · {run.backend} · {run.display_name} · {run.prompt_set} · {run.status}"


def request_label(result: PromptResult) -> str:
    text = " ".join(result.prompt_text.split())
    text = text if len(text) <= 60 else text[:57] + "..."
    steps = "unfinished" if result.num_steps is None else f"{result.num_steps} steps"
    return f"{result.prompt_index}: {text} ({steps})"


def load_replay(store: Store, run_id: int, prompt_index: int | None = None) -> Replay:
    """Request ``prompt_index`` of run ``run_id`` (default: its first request
    with steps).  Unknown runs and requests raise ``SpecUIError``."""
    run = store.get_run(run_id)
    results = store.get_results(run_id)
    if not results:
        raise user_error(f"run {run_id} stored no requests; nothing to replay")
    by_index = {r.prompt_index: r for r in results}
    if prompt_index is None:
        # num_steps is filled when a request ends; an unfinished one (None) may still have steps.
        prompt_index = next(
            (r.prompt_index for r in results if r.num_steps != 0), results[0].prompt_index
        )
    if prompt_index not in by_index:
        known = ", ".join(str(i) for i in sorted(by_index))
        raise user_error(f"run {run_id} has no request {prompt_index} (its requests: {known})")
    res = by_index[prompt_index]
    steps = store.get_traces(run_id, prompt_index)
    if not steps:
        raise user_error(
            f"request {prompt_index} of run {run_id} stored no steps; nothing to replay"
        )
    k = run.settings.get("num_speculative_tokens")
    k = k if isinstance(k, int) and k > 0 else max(s.num_drafted for s in steps)
    return Replay(
        run=run,
        prompt_index=prompt_index,
        prompt_text=res.prompt_text,
        steps=steps,
        source=step_source(run),
        num_speculative_tokens=k,
        stop_reason=res.stop_reason,
        wall_time_s=res.wall_time_s,
    )


def play(
    steps: list[StepTrace], steps_per_s: float, stop: threading.Event | None = None
) -> Iterator[StepTrace]:
    """Yield ``steps`` at a steady ``steps_per_s`` (0 = no waiting) until done or
    ``stop`` is set.  Each step is due at start + i / rate, so time spent
    rendering one step does not slow the pace down."""
    if not steps_per_s >= 0:
        raise user_error(f"steps per second must be >= 0, got {steps_per_s}")
    rate = min(float(steps_per_s), MAX_STEPS_PER_S)
    start = time.monotonic()
    for i, step in enumerate(steps):
        if rate > 0 and i:
            delay = start + i / rate - time.monotonic()
            if delay > 0 and stop is not None:
                if stop.wait(delay):
                    return
            elif delay > 0:
                time.sleep(delay)
        if stop is not None and stop.is_set():
            return
        yield step
