"""The evaluation stage: the metrics of the last ``log_every`` steps, averaged over steps and
processes, written to ``metrics.jsonl`` and passed to the caller's hooks."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from specui.atomic import write_text
from specui.training import distributed
from specui.training.hooks import TrainHooks

METRICS_FILE = "metrics.jsonl"


def summarize(window: list[dict[str, torch.Tensor]], d: distributed.Dist) -> dict[str, float]:
    """Mean of each metric over the window's steps and over processes (NaN = absent)."""
    names = sorted(window[0])
    local = torch.stack(
        [torch.stack([w[k].float().cpu() for w in window]).nanmean() for k in names]
    )
    return {k: float(v) for k, v in zip(names, d.mean(local).tolist(), strict=True)}


def strict(metrics: dict[str, float]) -> dict[str, float | None]:
    """NaN (an empty metric, e.g. no complete block) as null: files stay strict JSON."""
    return {k: None if math.isnan(v) else v for k, v in metrics.items()}


def trim_metrics(path: Path, step: int) -> None:
    """A resumed run's metrics file ends at its checkpoint: the lines a killed run logged
    after it (the resumed run logs those steps again) and a torn last line are dropped,
    in one atomic rewrite."""
    if not path.is_file():
        return
    text = path.read_text()
    kept = []
    for line in text.splitlines(keepends=True):
        try:
            whole = line.endswith("\n") and json.loads(line)["step"] <= step
        except (json.JSONDecodeError, KeyError, TypeError):
            whole = False
        if whole:
            kept.append(line)
    if "".join(kept) != text:
        write_text(path, "".join(kept))


class MetricsLog:
    """The steps since the last log line: their losses and grad norms, the logging step's
    metrics, tokens and time; ``last`` is what was logged last."""

    def __init__(self, out: Path, total: int, d: distributed.Dist, hooks: TrainHooks) -> None:
        self.path, self.total, self.d, self.hooks = out / METRICS_FILE, total, d, hooks
        self.last: dict[str, float] = {}
        self.window: list[dict[str, torch.Tensor]] = []
        self.shown: dict[str, torch.Tensor] = {}  # metrics of the logging step (those only)
        self.t_window, self.tokens = time.perf_counter(), 0

    def add(self, batch, loss: torch.Tensor, grad_norm: torch.Tensor, metrics: dict) -> None:
        self.tokens += sum(len(s) for s in batch)
        self.window.append({"loss": loss.detach(), "grad_norm": grad_norm.detach()})
        self.shown.update({k: v.detach() for k, v in metrics.items()})

    def log(self, step: int, lr: float) -> None:
        """The window's summary as step ``step``'s line (every process computes it: the means
        are collective)."""
        d = self.d
        elapsed = time.perf_counter() - self.t_window
        last = summarize(self.window, d)
        last.update(summarize([self.shown], d) if self.shown else {})
        last.update(
            lr=lr,
            step_time_s=elapsed / len(self.window),
            tokens_per_s=self.tokens * d.world / max(elapsed, 1e-9),
        )
        self.last, self.shown, self.window = last, {}, []
        self.t_window, self.tokens = time.perf_counter(), 0
        if not d.is_main:
            return
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **strict(last)}) + "\n")
        if self.hooks.metric:
            for k, v in last.items():
                self.hooks.metric(step, k, v)
        self.hooks.say(
            f"step {step}/{self.total} loss {last['loss']:.4f} accept_len"
            f" {last.get('accept_len', float('nan')):.2f} lr {lr:.2e}"
        )
