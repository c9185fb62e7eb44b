"""How a training run tells a person where it is: the stage, the count, the rate and an ETA.

The CLI draws these as tqdm bars (``specui.commands.train``); the job worker writes them
into the job's message, which the Train tab shows while the job runs, and into its log
(``specui.jobs.training``).  Torch-free: the job kind and the CLI import it before any model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

# Tokens a second of self-distillation, counted as prompts x max_new_tokens (the most a
# request can generate), for the estimate a run says before it generates anything.
# Measured on the embedded verifier (SmolLM2-135M-Instruct) with the batched generator
# (specui.data.generate) at the training default of 64 slots in bf16, one thread of the
# 2-core CPU SpecUI is developed on: 167-378 response tokens/s (bench/generation.py, 128
# general prompts, other work on the other core at the low end); 150 keeps the estimate on
# the long side.  A GPU is far faster: the progress bar's ETA, from the real rate,
# replaces this one after the first prompts.
GENERATION_TOKENS_PER_S = 150.0

# The unit one count of a stage is in (TrainHooks.stage's ``what``); others count "items".
STAGE_UNITS = {
    "generating responses": "prompt",
    "extracting hidden states": "sample",
    "training": "step",
}


def stage_unit(what: str) -> str:
    return STAGE_UNITS.get(what, "item")


def format_duration(seconds: float) -> str:
    """A rough duration: "40 s", "12 min", "3.4 h" (an ETA is no more precise than that)."""
    if seconds < 90:
        return f"{max(0, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def format_rate(per_s: float, unit: str) -> str:
    """Items a second, or seconds an item when that reads better (6.8 s/step)."""
    if per_s >= 1:
        return f"{per_s:.1f} {unit}s/s"
    return f"{1 / per_s:.1f} s/{unit}"


def generation_plan(prompts: int, todo: int, max_new_tokens: int) -> str:
    """The line a run says before self-distillation: what is cached, what must be generated
    and roughly how long that takes."""
    if todo == 0:
        return f"self-distillation: all {prompts} responses are cached, nothing to generate"
    tokens = todo * max_new_tokens
    eta = format_duration(tokens / GENERATION_TOKENS_PER_S)
    return (
        f"self-distillation: {prompts - todo} of {prompts} responses cached; generating {todo} "
        f"(up to {max_new_tokens} new tokens each, {tokens:,} tokens at most): roughly {eta} at "
        f"~{GENERATION_TOKENS_PER_S:.0f} tokens/s (a 2-core CPU; the progress bar's ETA follows "
        "the real rate)"
    )


@dataclass
class StageClock:
    """The rate and ETA of one stage, from its ``(done, total)`` reports.

    The rate counts from the stage's first report, so a resumed run (training from step
    400) measures its own speed, not the steps an earlier process did.
    """

    what: str
    clock: Callable[[], float] = time.monotonic
    _start: tuple[float, int] | None = field(default=None, init=False)

    def rate(self, done: int) -> float | None:
        """Items a second so far (None before anything was done in this stage)."""
        now = self.clock()
        if self._start is None:
            self._start = (now, done)
            return None
        t0, done0 = self._start
        if done <= done0 or now <= t0:
            return None
        return (done - done0) / (now - t0)

    def report(self, done: int, total: int, label: str | None = None) -> str:
        """'generating responses 40/10114 · 1.2 prompts/s · ETA 2.3 h' (no rate before one);
        ``label`` in place of the stage's name ("step" for training: 'step 5/200 · ...')."""
        unit = stage_unit(self.what)
        line = f"{label or self.what} {done}/{total}"
        per_s = self.rate(done)
        if per_s is not None:
            line += f" · {format_rate(per_s, unit)}"
            if done < total:
                line += f" · ETA {format_duration((total - done) / per_s)}"
        return line
