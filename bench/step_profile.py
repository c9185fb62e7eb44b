"""Where a verifier step's time goes: torch.profiler over one-token steps (run by hand).

    PYTHONPATH=. .venv/bin/python bench/step_profile.py [--steps 20] [--block 1] [--context 256]
                                                       [--precision bf16|int8|gguf] [--ablate]
                                                       [--ab bf16,int8,gguf]

Loads the embedded verifier in bf16 (or int8) and profiles ``--steps`` verifier steps of ``--block``
tokens after a cached context, once through ``specui.verifier.decoder.FastDecoder`` (what
``Verifier.forward`` runs) and once through transformers' modules with a ``DynamicCache``
(what it ran before).  Per path: wall ms per step (median, profiler off, interleaved),
the share of the step in oneDNN's matmuls, and the top ops by self time.

``--ablate`` instead times the fast path whole, then with its matmuls replaced by zeros of the
right shape, then also without the per-row input preparation (bf16 cast and pad, or int8
quantization), then also without attention, at 1 and 9 tokens: the differences are what each part
costs inside a real step
(the profiler's per-op times include its own overhead, and an isolated matmul loop runs from
warmer caches than a step does).  The numbers it prints are timings, never outputs: the
ablated steps compute garbage on purpose.

``--ab bf16,int8,gguf`` instead loads the embedded verifier once per named precision and times
their fast-path steps in one process, interleaved (a loaded machine drifts): median wall ms of
1- and 9-token steps after ``--context`` cached positions, and each one's ratio to the first.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import DynamicCache

from specui.kernels.packing import Int8Weight
from specui.verifier.batch_invariant import GGUFWeight
from specui.verifier.model import Verifier


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--block", type=int, default=1)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--rows", type=int, default=12, help="ops listed per path")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", choices=("bf16", "int8", "gguf"), default="bf16")
    ap.add_argument(
        "--ab", help="comma-separated precisions to time against each other in this process"
    )
    ap.add_argument(
        "--ablate",
        action="store_true",
        help="time the step without its matmuls, row preparation and attention in turn",
    )
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.ab:
        ab(a.ab.split(","), a.context, a.steps)
        return
    v = Verifier.load("embedded", precision=a.precision)
    if a.ablate:
        ablate(v, a.context, a.steps)
        return
    ids = torch.randint(
        100, v.vocab_size, (a.context + a.block,), generator=torch.Generator().manual_seed(0)
    )
    paths = {"fast": v.new_cache, "transformers": lambda: DynamicCache(config=v.config)}
    caches = {}
    for name, new in paths.items():
        caches[name] = new()
        v.forward(ids[: a.context], caches[name], logits=False)

    def step(name: str) -> None:
        v.forward(ids[a.context :], caches[name])
        v.crop(caches[name], a.context)

    walls: dict[str, list[float]] = {n: [] for n in paths}
    for _ in range(a.steps + 3):  # interleaved: a loaded machine drifts
        for name in paths:
            t0 = time.perf_counter()
            step(name)
            walls[name].append(time.perf_counter() - t0)
    print(
        f"{a.precision}: {a.block}-token steps after {a.context} cached positions, {a.threads}"
        " thread(s)"
    )
    for name in paths:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(a.steps):
                step(name)
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        matmul = sum(
            e.self_cpu_time_total for e in events if "linear_pointwise" in e.key
        )  # bf16 and int8 (qlinear)
        calls = sum(e.count for e in events if e.key.startswith("aten::")) / a.steps
        wall = statistics.median(walls[name][3:]) * 1e3
        print(
            f"\n{name}: {wall:.1f} ms/step (median, profiler off); profiled"
            f" {total / a.steps / 1e3:.1f} ms/step, {matmul / total:.0%} in oneDNN matmuls,"
            f" {calls:.0f} aten calls/step"
        )
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: a.rows]:
            print(
                f"  {e.key[:48]:<48}{e.self_cpu_time_total / total:>7.1%}{e.count / a.steps:>8.0f}"
                " calls/step"
            )


def ab(precisions: list[str], context: int, steps: int) -> None:
    """Median wall ms of fast-path steps of 1 and 9 tokens per precision, interleaved in one
    process."""
    verifiers = {p: Verifier.load("embedded", precision=p) for p in precisions}
    vocab = next(iter(verifiers.values())).vocab_size
    ids = torch.randint(100, vocab, (context + 9,), generator=torch.Generator().manual_seed(0))
    caches = {}
    for p, v in verifiers.items():
        if v.precision != p or v._fast is None:
            raise SystemExit(
                f"{p}: the verifier loaded as {v.precision}, fast path {v._fast is not None}"
            )
        caches[p] = v.new_cache()
        v.forward(ids[:context], caches[p], logits=False)
    print(
        f"fast-path steps after {context} cached positions, median of {steps} (interleaved), one"
        " thread"
    )
    print(f"{'tokens':>6}  " + "  ".join(f"{p:>16}" for p in precisions))
    for n in (1, 9):
        walls: dict[str, list[float]] = {p: [] for p in precisions}
        for rep in range(steps + 3):
            for p, v in verifiers.items():
                t0 = time.perf_counter()
                v.forward(ids[context : context + n], caches[p])
                if rep >= 3:
                    walls[p].append((time.perf_counter() - t0) * 1e3)
                v.crop(caches[p], context)
        med = {p: statistics.median(w) for p, w in walls.items()}
        first = med[precisions[0]]
        print(f"{n:>6}  " + "  ".join(f"{m:>7.2f} ms {first / m:>4.2f}x" for m in med.values()))


def ablate(v: Verifier, context: int, steps: int) -> None:
    """Median wall ms of a fast-path step whole, then without matmuls, row preparation and attention
    in turn."""
    fd = v._fast
    if fd is None:
        raise SystemExit("this verifier does not run through specui.verifier.decoder.FastDecoder")
    mm, rows = fd.mm, fd.rows

    def no_mm(x, w: tuple, n: int) -> torch.Tensor:
        # int8: an Int8Weight; gguf: a GGUFWeight; bf16: (oneDNN's packed [out, in] or None, bias,
        # the AMX kernel's PackedBF16 or None, bias)
        if isinstance(w, Int8Weight | GGUFWeight):
            return torch.zeros(n, w.out_features)
        return torch.zeros(n, w[2].out_features if w[2] is not None else w[0].shape[0])

    def no_attention(q: torch.Tensor, keys, values, scale: float, start: int) -> torch.Tensor:
        return torch.zeros(q.shape[0], q.shape[1] * q.shape[2])

    attention = fd._attention
    variants = {  # name: (matmul, row preparation, attention)
        "whole step": (mm, rows, attention),
        "no matmuls": (no_mm, rows, attention),
        "no matmuls, no row prep": (no_mm, lambda x: x, attention),
        "nor attention": (no_mm, lambda x: x, no_attention),
    }
    ids = torch.randint(
        100, v.vocab_size, (context + 9,), generator=torch.Generator().manual_seed(0)
    )
    cache = v.new_cache()
    v.forward(ids[:context], cache, logits=False)
    print(
        f"{v.precision}: fast-path step after {context} cached positions, median of {steps}"
        " (interleaved)"
    )
    print(f"{'tokens':>6}  " + "  ".join(f"{name:>24}" for name in variants))
    try:
        for n in (1, 9):
            walls: dict[str, list[float]] = {name: [] for name in variants}
            for rep in range(steps + 3):
                for name, (fd.mm, fd.rows, fd._attention) in variants.items():
                    t0 = time.perf_counter()
                    fd.forward(ids[context : context + n], cache, set())
                    if rep >= 3:
                        walls[name].append((time.perf_counter() - t0) * 1e3)
                    cache.crop(context)
            print(
                f"{n:>6}  " + "  ".join(f"{statistics.median(w):>21.1f} ms" for w in walls.values())
            )
    finally:
        fd.mm, fd.rows = mm, rows
        del fd._attention  # back to the class's method


if __name__ == "__main__":
    main()
