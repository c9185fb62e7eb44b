"""The drafters on the int8-row kernel beside a ``gguf-q8`` verifier, against their bf16 path.

    PYTHONPATH=. .venv/bin/python bench/draft_int8.py [--prompts 24] [--max-new-tokens 128]
        [--algorithms dflash,dspark,eagle3,peagle]

Beside a ``gguf-q8`` verifier each learned drafter's one-call matmuls read its weights as Q8_0
blocks times rows made int8 (``LearnedDrafter.matmuls_in_bf16(int8_rows=True)``), where beside
``gguf`` they read bf16 weights.  Per shipped drafter, on the first ``--prompts`` Spec-Bench
questions (greedy, every drafter sending K drafts a step, no policy):

- slot agreement: both paths draft from the same contexts (one decode drives both, the int8
  path's drafts are sent), and the share of slots where they propose the same token, first slots
  and all slots;
- tau of each path decoding on its own, the median over prompts with a 95% bootstrap interval;
- the mean draft ms a step of each path (the engine's own timers).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import numpy as np
import torch

from specui.algorithms.layer_call import DraftLayerCall
from specui.algorithms.resolve import resolve_drafter
from specui.data import load_prompts
from specui.engine import Decoding
from specui.verifier.model import Verifier


class Paired:
    """Drafts with ``sent`` and, from the same context, with ``other``; counts where they agree."""

    def __init__(self, sent: Any, other: Any) -> None:
        self.sent, self.other = sent, other
        self.slots = self.same = self.first = self.first_same = 0

    def __getattr__(self, name: str) -> Any:  # everything else is the sent drafter's
        return getattr(self.sent, name)

    def reset(self) -> None:
        self.sent.reset()
        self.other.reset()

    def propose(self, ctx: Any) -> Any:
        a, b = self.sent.propose(ctx), self.other.propose(ctx)
        ta, tb = list(a.token_ids), list(b.token_ids)
        n = min(len(ta), len(tb))
        self.slots += n
        self.same += sum(x == y for x, y in zip(ta[:n], tb[:n], strict=True))
        if n:
            self.first += 1
            self.first_same += ta[0] == tb[0]
        return a


def bf16_path(drafter: Any) -> Any:
    """The same drafter with its one call back on bf16 weights (the ``gguf`` path)."""
    for linear in drafter.call_linears():
        linear.__dict__.pop("weight_q8", None)
    drafter.layer_call = DraftLayerCall.build(drafter.model, drafter.model.head_module())
    return drafter


def interval(values: list[float], seed: int = 0) -> tuple[float, float, float]:
    x = np.asarray(values, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(2000, len(x)))
    meds = np.median(x[idx], axis=1)
    return float(np.median(x)), float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def decode(v: Verifier, drafter: Any, ids: list[int], max_new: int) -> tuple[float, float]:
    """(tau, mean draft ms a drafting step) of one greedy decode."""
    run = Decoding(v, drafter, ids, max_new_tokens=max_new)
    for _ in run:
        pass
    steps = [s for s in run.result.steps if s.num_drafted]
    tau = 1 + sum(s.num_accepted for s in steps) / max(1, len(steps))
    ms = statistics.mean(s.draft_time_s * 1e3 for s in steps) if steps else 0.0
    return tau, ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--algorithms", default="dflash,dspark,eagle3,peagle")
    a = ap.parse_args()
    torch.set_num_threads(1)
    v = Verifier.load("embedded", precision="gguf-q8")
    prompts = [p.encode(v) for p in load_prompts("spec-bench", limit=a.prompts)]
    print(f"{len(prompts)} Spec-Bench prompts, {a.max_new_tokens} tokens, greedy, gguf-q8 verifier")
    print(
        "| drafter | slots agreeing | first slots agreeing | tau int8 rows [95%] | tau bf16 [95%]"
        " | draft ms int8 / bf16 |"
    )
    print("|---|---|---|---|---|---|")
    for name in a.algorithms.split(","):
        int8 = resolve_drafter(name, v)
        paired = Paired(int8, bf16_path(resolve_drafter(name, v)))
        for ids in prompts:
            decode(v, paired, ids, a.max_new_tokens)
        bf16 = bf16_path(resolve_drafter(name, v))
        runs = {"int8": [], "bf16": []}
        for ids in prompts:  # interleaved, so that drift hits both alike
            runs["int8"].append(decode(v, int8, ids, a.max_new_tokens))
            runs["bf16"].append(decode(v, bf16, ids, a.max_new_tokens))
        cells = []
        for path in ("int8", "bf16"):
            med, lo, hi = interval([t for t, _ in runs[path]])
            cells.append(f"{med:.2f} [{lo:.2f}, {hi:.2f}]")
        ms = [statistics.mean(m for _, m in runs[p]) for p in ("int8", "bf16")]
        print(
            f"| {name} | {paired.same / max(1, paired.slots):.2%} of {paired.slots}"
            f" | {paired.first_same / max(1, paired.first):.2%} | {cells[0]} | {cells[1]}"
            f" | {ms[0]:.2f} / {ms[1]:.2f} |"
        )


if __name__ == "__main__":
    main()
