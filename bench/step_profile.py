"""Where a verifier step's time goes: torch.profiler over one-token steps (run by hand).

    PYTHONPATH=. .venv/bin/python bench/step_profile.py [--steps 20] [--block 1] [--context 256]
                                                       [--precision bf16|int8]

Loads the embedded verifier in bf16 (or int8) and profiles ``--steps`` verifier steps of ``--block``
tokens after a cached context, once through ``specui.decoder.FastDecoder`` (what
``Verifier.forward`` runs) and once through transformers' modules with a ``DynamicCache``
(what it ran before).  Per path: wall ms per step (median, profiler off, interleaved),
the share of the step in oneDNN's matmuls, and the top ops by self time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import DynamicCache

from specui.verifier import Verifier


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--block", type=int, default=1)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--rows", type=int, default=12, help="ops listed per path")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", choices=("bf16", "int8"), default="bf16")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    v = Verifier.load("embedded", precision=a.precision)
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
    print(f"{a.precision}: {a.block}-token steps after {a.context} cached positions, {a.threads} thread(s)")
    for name in paths:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(a.steps):
                step(name)
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        matmul = sum(e.self_cpu_time_total for e in events if "linear_pointwise" in e.key)  # bf16 and int8 (qlinear)
        calls = sum(e.count for e in events if e.key.startswith("aten::")) / a.steps
        wall = statistics.median(walls[name][3:]) * 1e3
        print(f"\n{name}: {wall:.1f} ms/step (median, profiler off); profiled {total / a.steps / 1e3:.1f} ms/step, "
              f"{matmul / total:.0%} in oneDNN matmuls, {calls:.0f} aten calls/step")  # fmt: skip
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: a.rows]:
            print(
                f"  {e.key[:48]:<48}{e.self_cpu_time_total / total:>7.1%}{e.count / a.steps:>8.0f} calls/step"
            )


if __name__ == "__main__":
    main()
