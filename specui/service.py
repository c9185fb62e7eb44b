"""The run service: decode prompts with drafters and record every step in the store.

``decode_and_record`` is the one place a local decoding run meets the store.  The
Playground (side by side, streamed), the API, ``specui decode``, ``specui bench`` and the
background benchmark job all call it, directly or through ``record_runs``.  A run's stored
settings come from ``run_settings`` (a ``DecodeRequest`` and the K the drafter resolved),
for the vLLM bench's runs too (``specui.vllm.bench.run_benchmark``, which ``specui vllm
bench``, the vLLM tab and ``bench/vllm_vs_local.py`` call).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from specui.algorithms.base import Drafter
from specui.algorithms.spec import drafter_option_label
from specui.data import Prompt
from specui.engine import Decoding
from specui.errors import SpecUIError
from specui.policy import DEFAULT_POLICY, POLICIES, Policy, make_policy
from specui.store import DecodingSettings, Run, RunRecorder, Store
from specui.trace import GenerationResult, SamplingParams, StepTrace, check_decode_settings
from specui.verifier.model import Verifier

# Decodes that run at once in this process: each holds a core for its whole length.  A
# dashboard event holds a slot only while it decodes, not while its models load (a hub
# download, a GGUF conversion, a load that times out): other visitors keep decoding meanwhile.
DECODE_SLOTS = 2
# Events of the dashboard's "decode" group Gradio runs at once: two decoding, the rest
# loading their models or waiting for a slot (threads that cost no CPU).
DECODE_EVENTS = DECODE_SLOTS + 4
_slots = threading.BoundedSemaphore(DECODE_SLOTS)


@contextmanager
def decode_slot(should_stop: Callable[[], bool] | None = None) -> Iterator[bool]:
    """Hold one of the DECODE_SLOTS for the block; yields False (holding none) when
    ``should_stop`` turns true while waiting, so a closed tab stops waiting too."""
    while not _slots.acquire(timeout=0.2):
        if should_stop is not None and should_stop():
            yield False
            return
    try:
        yield True
    finally:
        _slots.release()


@dataclass
class DecodeRequest:
    """What one run is asked to decode with: the drafter choice, K, sampling, length, seed."""

    drafter: str  # none | ngram | shipped name | folder
    num_speculative_tokens: int | None = None
    sampling: SamplingParams = SamplingParams()
    max_new_tokens: int = 128
    seed: int = 0
    drafter_options: dict | None = None
    stop_strings: tuple[str, ...] = ()
    # How many drafts a step sends (``specui.policy``): ``adaptive`` (from the measured cost
    # model) or ``fixed`` (every draft: the raw drafter at its K).  Local runs only.
    policy: str = DEFAULT_POLICY

    def __post_init__(self) -> None:
        # Checked here, before any run row exists: a bad setting stores nothing.
        if self.policy not in POLICIES:
            raise SpecUIError(
                f"unknown decoding policy {self.policy!r}; known: {', '.join(POLICIES)}"
            )
        check_decode_settings(
            max_new_tokens=self.max_new_tokens,
            seed=self.seed,
            num_speculative_tokens=self.num_speculative_tokens,
        )


def run_settings(
    request: DecodeRequest, num_speculative_tokens: int | None, extra: dict | None = None
) -> DecodingSettings:
    """The stored settings of a run of ``request`` (K as the drafter resolved it)."""
    options = request.drafter_options or {}
    policy = drafter_option_label("confidence_policy", options.get("confidence_policy"))
    return DecodingSettings(
        num_speculative_tokens=num_speculative_tokens,
        temperature=request.sampling.temperature,
        top_p=request.sampling.top_p,
        top_k=request.sampling.top_k,
        max_new_tokens=request.max_new_tokens,
        confidence_policy=policy,
        extra=extra or {},
    )


def start_run(
    store: Store,
    verifier: Verifier,
    drafter: Drafter,
    *,
    prompt_set: str,
    request: DecodeRequest,
    owner: str | None = None,
    policy: Policy | None = None,
) -> Run:
    """Create the stored run for decoding with ``drafter`` as ``request`` asks (status running).
    ``policy``: the run's decoding policy, whose settings (its name, the cost model it chose
    by) are stored with the run."""
    # The drafter's own settings too (the n-gram sizes): a run must say what it measured.
    own = dict(getattr(drafter, "stored_settings", None) or {})
    extra = {"verifier_precision": verifier.precision, **own}
    if drafter.num_speculative_tokens > 0:  # a plain run has no drafts to choose
        extra.update(policy.settings() if policy is not None else {"policy": request.policy})
    settings = run_settings(request, drafter.num_speculative_tokens, extra)
    return store.create_run(
        prompt_set=prompt_set,
        settings=settings,
        seed=request.seed,
        owner=owner,
        verifier=verifier.name,
        verifier_fingerprint=verifier.fingerprint,
        algorithm=drafter.algorithm,
        drafter=drafter.name,
    )


@dataclass
class Lane:
    """One (drafter, request) of a call: its stored run and what it has decoded."""

    drafter: Drafter
    request: DecodeRequest
    run_id: int | None  # None when nothing is recorded
    results: list[GenerationResult] = field(
        default_factory=list
    )  # one per prompt (fewer after a stop)
    steps: list[StepTrace] = field(default_factory=list)  # the current prompt's steps so far
    done: bool = False  # the current prompt is finished
    decoding: Decoding | None = None  # the current prompt's (its .result grows step by step)
    policy: Policy | None = None  # one for all the run's prompts: it learns the acceptance

    @property
    def name(self) -> str:
        return self.drafter.name


@dataclass
class Event:
    """What ``decode_and_record`` yields: a step of one lane, or the end of a prompt."""

    lane: int
    prompt: int
    step: StepTrace | None  # None: the lane finished the prompt (its result is lane.results[-1])
    lanes: list[Lane]


def encode_prompts(verifier: Verifier, prompts: Sequence[Prompt]) -> list[tuple[list[int], str]]:
    """(token ids, stored text) of each prompt, for ``decode_and_record``."""
    return [(p.encode(verifier), p.preview(10_000)) for p in prompts]


def decode_and_record(
    store: Store | None,
    verifier: Verifier,
    runs: Sequence[tuple[Drafter, DecodeRequest]],
    prompts: Sequence[tuple[list[int], str]],
    *,
    prompt_set: str,
    owner: str | None = None,
    should_stop: Callable[[], bool] | None = None,
    side_by_side: bool = False,
) -> Recording:
    """Decode ``prompts`` (token ids, text) with every (drafter, request), storing one run each;
    iterate the returned ``Recording`` to run it (its ``lanes`` hold the runs and results).

    Prompt by prompt: every run decodes prompt 0, then prompt 1, ...  On a noisy machine a
    slow minute then hits every run alike, so a bench's speedups stay ratios of like with
    like.  ``side_by_side`` alternates the runs step by step within a prompt (the
    Playground's lanes); otherwise each run decodes the whole prompt in turn.  Prompt i is
    decoded with seed ``request.seed + i``.

    Every Decoding is built, and so checked, here, before any run row exists: a prompt that
    cannot run (too long, bad token ids) stores nothing.  A stop (``should_stop``, or a
    decode that ends cancelled) ends every run as "stopped" with what was decoded so far.
    ``store`` None decodes without recording (``specui decode`` without ``--db``).
    """
    for _, request in runs:
        check_decode_settings(
            max_new_tokens=request.max_new_tokens, max_context=verifier.max_context
        )
    lanes = [Lane(d, request, None, policy=make_policy(request.policy)) for d, request in runs]
    decodings = [
        [
            Decoding(
                verifier,
                lane.drafter,
                ids,
                max_new_tokens=lane.request.max_new_tokens,
                sampling=lane.request.sampling,
                seed=lane.request.seed + i,
                should_stop=should_stop,
                stop_strings=list(lane.request.stop_strings),
                policy=lane.policy,
            )
            for lane in lanes
        ]
        for i, (ids, _) in enumerate(prompts)
    ]
    return Recording(
        store,
        verifier,
        lanes,
        decodings,
        [text for _, text in prompts],
        prompt_set,
        owner,
        should_stop,
        side_by_side,
    )


@dataclass
class Recording:
    """A checked decode-and-record call; iterating it decodes, records and yields each Event."""

    store: Store | None
    verifier: Verifier
    lanes: list[Lane]
    decodings: list[list[Decoding]]  # [prompt][lane]
    texts: list[str]
    prompt_set: str
    owner: str | None
    should_stop: Callable[[], bool] | None
    side_by_side: bool

    def __iter__(self) -> Iterator[Event]:
        with ExitStack() as recording:
            # The slot before any run row: a call waiting for one has stored nothing yet.
            if not recording.enter_context(decode_slot(self.should_stop)):
                return
            recorders: list[RunRecorder | None] = []
            for lane in self.lanes:
                if self.store is None:
                    recorders.append(None)
                    continue
                run = start_run(
                    self.store,
                    self.verifier,
                    lane.drafter,
                    prompt_set=self.prompt_set,
                    request=lane.request,
                    owner=self.owner,
                    policy=lane.policy,
                )
                lane.run_id = run.id
                recorders.append(recording.enter_context(RunRecorder(self.store, run.id)))

            def stop_all() -> None:
                for rec in recorders:
                    if rec is not None:
                        rec.stop()

            for i, text in enumerate(self.texts):
                if self.should_stop is not None and self.should_stop():
                    stop_all()
                    return
                yield from self._prompt(i, text, recorders)
                self.decodings[
                    i
                ] = []  # a finished decoding still holds its KV cache: let it go now
                if any(lane.results[-1].stop_reason == "cancelled" for lane in self.lanes):
                    stop_all()  # every run ends stopped, not only the one that saw it
                    return

    def _prompt(self, i: int, text: str, recorders: list[RunRecorder | None]) -> Iterator[Event]:
        iters = [iter(d) for d in self.decodings[i]]
        for lane, rec, decoding in zip(self.lanes, recorders, self.decodings[i], strict=True):
            lane.steps, lane.done, lane.decoding = [], False, decoding
            if rec is not None:
                rec.begin_prompt(i, text)
        while not all(lane.done for lane in self.lanes):
            for j, (lane, rec, it) in enumerate(zip(self.lanes, recorders, iters, strict=True)):
                while not lane.done:
                    step = next(it, None)
                    if step is None:
                        lane.done = True
                        result = self.decodings[i][j].result
                        lane.results.append(result)
                        if rec is not None:
                            rec.end_prompt(result)
                        yield Event(j, i, None, self.lanes)
                        break
                    lane.steps.append(step)
                    if rec is not None:
                        rec.step(step)
                    yield Event(j, i, step, self.lanes)
                    if self.side_by_side:
                        break


@dataclass
class RecordedRun:
    run_id: int
    results: list[GenerationResult]  # one per prompt decoded (fewer after a stop)
    policy: Policy | None = None  # the run's decoding policy (its cost model, its rates)


def record_runs(
    store: Store,
    verifier: Verifier,
    runs: Sequence[tuple[Drafter, DecodeRequest]],
    prompts: Sequence[Prompt],
    *,
    prompt_set: str,
    owner: str | None = None,
    should_stop: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[RecordedRun]:
    """``decode_and_record`` to the end: one stored run per (drafter, request).

    ``progress(done, total)`` is called after each prompt has been decoded by every run."""
    recording = decode_and_record(
        store,
        verifier,
        runs,
        encode_prompts(verifier, prompts),
        prompt_set=prompt_set,
        owner=owner,
        should_stop=should_stop,
    )
    for event in recording:
        if progress is not None and event.step is None and all(lane.done for lane in event.lanes):
            progress(event.prompt + 1, len(prompts))
    return [
        RecordedRun(lane.run_id, lane.results, lane.policy)
        for lane in recording.lanes
        if lane.run_id is not None
    ]


def record_run(
    store: Store,
    verifier: Verifier,
    drafter: Drafter,
    prompts: Sequence[Prompt],
    *,
    prompt_set: str,
    request: DecodeRequest,
    owner: str | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> RecordedRun:
    """One drafter's run over ``prompts`` (see ``record_runs``)."""
    return record_runs(
        store,
        verifier,
        [(drafter, request)],
        prompts,
        prompt_set=prompt_set,
        owner=owner,
        should_stop=should_stop,
    )[0]
