"""The measured cost model: what a verify of r rows and a drafter's draft cost on this machine.

Measured, never typed in: the verify curve moves with the kernels, the precision, the thread
count and the CPU (a 9-row verify has cost 1.2x to 4.6x a one-token step across SpecUI's own
history), and the policy's choices are only as good as the curve.  A model is measured once
per (verifier weights, precision, machine, kernel sources, torch, threads) and kept as JSON in
``data_dir()/cost_models``; a change to any of those (a kernel rewrite included: the key hashes
their source files) makes a new file, so it is measured again.

Each figure is the least of interleaved repeats at a fixed context (a few ms each), made
non-decreasing in the rows (a longer block cannot cost less).  The least, not the median: other
processes only ever add time to a sample, and a model measured on a busy machine is kept and
read by every later run.  On two busy cores (a training and a test suite beside it) the medians
once made a 2-row verify 1.64x a 1-row one and an 8-row 4.2x (quiet: 1.11x, 2.0x), and the
policy then sent no draft at all; the least of the repeats stays near the quiet curve as long as
some repeats of each point ran undisturbed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specui.algorithms.base import DraftContext, Drafter
from specui.atomic import write_text
from specui.paths import REPO_ROOT, data_dir
from specui.trace import SamplingParams

log = logging.getLogger(__name__)

VERIFY_CONTEXT = 128  # cached tokens before the timed blocks (a typical chat prompt's length)
REPEATS = 7
COST_MODEL_VERSION = 2  # bump when what is measured changes (it is part of the cache key)


@dataclass
class CostModel:
    """Seconds for a verify of 1..R rows (``verify_s[r - 1]``), each drafter's steady-state
    draft, and what a learned drafter's draft costs more for each committed position it has not
    read yet (``catchup_s``: its first draft of a prompt reads the whole prompt; a draft after
    plain steps reads each position they committed)."""

    verify_s: list[float]
    draft_s: dict[str, float] = field(default_factory=dict)  # drafter key -> seconds a draft
    key: dict[str, Any] = field(default_factory=dict)  # what the figures were measured on
    catchup_s: dict[str, float] = field(default_factory=dict)  # drafter key -> s a position

    def verify(self, rows: int) -> float:
        """A block of ``rows``; past the measured ones, the last slope carried on."""
        v = self.verify_s
        if rows <= len(v):
            return v[max(rows, 1) - 1]
        slope = v[-1] - v[-2] if len(v) > 1 else v[-1]
        return v[-1] + max(slope, 0.0) * (rows - len(v))

    def draft(self, drafter: Drafter) -> float | None:
        return self.draft_s.get(drafter_key(drafter))

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": COST_MODEL_VERSION,
            "verify_ms": [round(s * 1e3, 6) for s in self.verify_s],
            "draft_ms": {k: round(s * 1e3, 6) for k, s in self.draft_s.items()},
            # A position's catch-up is a fraction of a microsecond: kept to the picosecond so
            # that the value read back is the value measured, not one rounded by a third.
            "catchup_ms": {k: round(s * 1e3, 9) for k, s in self.catchup_s.items()},
            "key": self.key,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CostModel:
        return cls(
            verify_s=[float(x) / 1e3 for x in d["verify_ms"]],
            draft_s={k: float(x) / 1e3 for k, x in d.get("draft_ms", {}).items()},
            key=dict(d.get("key", {})),
            catchup_s={k: float(x) / 1e3 for k, x in d.get("catchup_ms", {}).items()},
        )

    def summary(self) -> str:
        """One line for logs and the bench's header: ms per verify by rows, ratio to one row."""
        one = self.verify_s[0]
        rows = ", ".join(
            f"{r + 1}: {s * 1e3:.1f} ({s / one:.2f}x)" for r, s in enumerate(self.verify_s)
        )
        drafts = ", ".join(f"{k.split('|')[0]} {s * 1e3:.2f}" for k, s in self.draft_s.items())
        catchup = ", ".join(f"{k.split('|')[0]} {s * 1e6:.1f}" for k, s in self.catchup_s.items())
        return (
            f"verify ms by rows {rows}"
            + (f"; draft ms {drafts}" if drafts else "")
            + (f"; catch-up us a position {catchup}" if catchup else "")
        )


def kernel_version() -> str:
    """A hash of the verifier's and kernels' sources: a kernel rewrite makes a new cost model."""
    h = hashlib.sha256()
    for folder in ("specui/verifier", "specui/kernels"):
        root = REPO_ROOT / folder
        if root.is_dir():
            for p in sorted(root.rglob("*")):
                if p.suffix in (".c", ".h", ".py") and p.is_file():
                    h.update(str(p.relative_to(REPO_ROOT)).encode())
                    h.update(p.read_bytes())
    return h.hexdigest()[:16]


def machine() -> str:
    """This machine: host, CPU model and core count."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()}|{cpu}|{os.cpu_count()}"


def model_key(verifier: Any) -> dict[str, Any]:
    return {
        "version": COST_MODEL_VERSION,
        "verifier": verifier.fingerprint,
        "precision": getattr(verifier, "precision", "fp32"),
        "machine": machine(),
        "kernels": kernel_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_kernels": os.environ.get("SPECUI_CPU_KERNELS", "1"),
    }


def drafter_key(drafter: Drafter) -> str:
    """A drafter's entry in ``draft_s``: name, algorithm, K and its weights where it has any."""
    model = getattr(drafter, "model", None)
    # taken before a serving drafter let its float32 weights go (specui.algorithms.serving)
    weights = getattr(drafter, "weights_fingerprint", None) or ""
    if not weights and isinstance(model, torch.nn.Module):
        from specui.verifier.fingerprint import model_fingerprint

        weights = model_fingerprint(model)
    bf16 = "bf16" if getattr(drafter, "layer_call", None) is not None else ""
    return f"{drafter.name}|{drafter.algorithm}|k{drafter.num_speculative_tokens}|{weights}{bf16}"


def steady(samples: list[float]) -> float:
    """A figure from repeated timings: the least (see the module docstring)."""
    return min(samples)


def _tokens(verifier: Any, n: int) -> torch.Tensor:
    # Any fixed ids do: a step's cost does not depend on which tokens it reads.
    return (torch.arange(n, dtype=torch.long) * 7919 + 11) % max(verifier.vocab_size - 1, 1)


@torch.inference_mode()
def measure_verify(verifier: Any, max_rows: int, repeats: int = REPEATS) -> list[float]:
    """Seconds of a verify of 1..max_rows rows after ``VERIFY_CONTEXT`` cached tokens (``steady``
    over the repeats), made non-decreasing."""
    context = max(1, min(VERIFY_CONTEXT, verifier.max_context - max_rows - 2))
    ids = _tokens(verifier, context + max_rows)
    cache = verifier.new_cache()
    verifier.forward(ids[:context], cache, logits=False)
    times: list[list[float]] = [[] for _ in range(max_rows)]
    for rep in range(repeats + 1):  # the first pass warms caches and lazy set-up: not kept
        for r in range(1, max_rows + 1):
            t0 = time.perf_counter()
            verifier.forward(ids[context : context + r], cache)
            elapsed = time.perf_counter() - t0
            verifier.crop(cache, context)
            if rep:
                times[r - 1].append(elapsed)
    each = [steady(t) for t in times]
    return [max(each[: i + 1]) for i in range(len(each))]


@torch.inference_mode()
def measure_draft(verifier: Any, drafter: Drafter, repeats: int = REPEATS) -> float:
    """Seconds of one steady-state draft (``steady`` over the repeats): the drafter has seen the
    context before and catches up on two new tokens a draft, as after a step that accepted one."""
    base = max(2, min(VERIFY_CONTEXT, verifier.max_context - 2 * repeats - 16))
    total = base + 2 * (repeats + 1)
    ids = _tokens(verifier, total)
    aux = drafter.aux_layer_ids
    feats = None
    if aux:
        feats = verifier.forward(ids[:-1], verifier.new_cache(), aux, logits=False).aux_hidden
    sampling, gen = SamplingParams(), torch.Generator().manual_seed(0)
    drafter.reset()
    times = []
    try:
        for i in range(repeats + 1):
            n = base + 2 * i
            ctx = DraftContext(ids[:n], None if feats is None else feats[: n - 1], sampling, gen)
            t0 = time.perf_counter()
            drafter.propose(ctx)
            if i:  # the first draft reads the whole context: not a steady-state one
                times.append(time.perf_counter() - t0)
    finally:
        drafter.reset()
    return steady(times)


CATCHUP_GAP = 48  # positions committed between the timed drafts of ``measure_catchup``


@torch.inference_mode()
def measure_catchup(verifier: Any, drafter: Drafter, draft_s: float, repeats: int = 3) -> float:
    """Seconds a learned drafter's draft costs more for each committed position it has not read
    (``steady`` over drafts made ``CATCHUP_GAP`` positions apart, less the steady draft
    ``draft_s``): what a probe after a run of plain steps pays, and a prompt's first draft."""
    base = max(2, min(VERIFY_CONTEXT // 2, verifier.max_context - CATCHUP_GAP * (repeats + 1) - 8))
    total = base + CATCHUP_GAP * (repeats + 1)
    if total >= verifier.max_context:
        return 0.0
    ids = _tokens(verifier, total)
    feats = verifier.forward(ids[:-1], verifier.new_cache(), drafter.aux_layer_ids, logits=False)
    sampling, gen = SamplingParams(), torch.Generator().manual_seed(0)
    drafter.reset()
    times = []
    try:
        for i in range(repeats + 1):
            n = base + CATCHUP_GAP * i
            ctx = DraftContext(ids[:n], feats.aux_hidden[: n - 1], sampling, gen)
            t0 = time.perf_counter()
            drafter.propose(ctx)
            if i:  # the first read the base context from nothing
                times.append(time.perf_counter() - t0)
    finally:
        drafter.reset()
    return max(0.0, (steady(times) - draft_s) / (CATCHUP_GAP - 2))


def catches_up(drafter: Drafter) -> bool:
    """Whether the drafter keeps a cache over the committed positions (a learned one)."""
    return bool(drafter.aux_layer_ids) and hasattr(drafter, "cached_positions")


def _path(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return data_dir() / "cost_models" / f"{digest}.json"


_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def known_cost_model(verifier: Any) -> CostModel | None:
    """The verifier's cost model if this process has it or it is cached on disk; never measures
    (the Playground's chart asks while a preload may be measuring: it must not wait on it)."""
    model = _MEMO.get(verifier)
    if model is not None:
        return model
    path = _path(model_key(verifier))
    try:
        return CostModel.from_dict(json.loads(path.read_text())) if path.is_file() else None
    except (OSError, ValueError, KeyError):
        return None


def cost_model(verifier: Any, max_rows: int = 9, drafters: tuple[Drafter, ...] = ()) -> CostModel:
    """The verifier's cost model with at least ``max_rows`` rows and a draft figure for each of
    ``drafters``: from memory, else from the cache file, else measured now (and saved)."""
    with _LOCK:  # two lanes starting at once measure once
        model = _MEMO.get(verifier)
        key = model.key if model is not None else model_key(verifier)
        path = _path(key)
        # $SPECUI_REMEASURE_COSTS=1: a quiet machine's figures replace a busy one's.
        fresh = os.environ.get("SPECUI_REMEASURE_COSTS", "") not in ("", "0")
        if model is None and path.is_file() and not fresh:
            try:
                model = CostModel.from_dict(json.loads(path.read_text()))
            except (OSError, ValueError, KeyError) as e:
                log.warning("cost model %s unreadable (%s); measuring again", path, e)
        changed = False
        if model is None or len(model.verify_s) < max_rows:
            drafts = dict(model.draft_s) if model else {}
            model = CostModel(measure_verify(verifier, max_rows), drafts, key)
            changed = True
        for d in drafters:
            key = drafter_key(d)
            if model.draft(d) is None:
                model.draft_s[key] = measure_draft(verifier, d)
                changed = True
            if catches_up(d) and key not in model.catchup_s:
                model.catchup_s[key] = measure_catchup(verifier, d, model.draft_s[key])
                changed = True
        _MEMO[verifier] = model
        if changed:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_text(path, json.dumps(model.to_dict(), indent=1))
            except OSError as e:  # a read-only data folder: measured again next process
                log.warning("could not save the cost model to %s: %s", path, e)
            log.info("cost model: %s", model.summary())
        return model
