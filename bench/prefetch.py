"""The matmul kernels' weight prefetch, on against off, in one run (by hand).

    PYTHONPATH=. .venv/bin/python bench/prefetch.py [--repeats 15] [--context 256]

A pass of several rows spends ~16 cycles on each 128 bytes of weights, too slowly for the hardware
prefetcher to keep enough lines in flight from DRAM, so the kernels prefetch 4 KiB ahead into L2
(``Kernel.set_prefetch_ahead``).  Times, with it off (0) and on (the default), interleaved repeat
by repeat so that drift on a loaded machine hits both alike:
- a bf16 matmul of 8 rows through 70 MB of weights (20 copies of 3072 x 576, so DRAM serves them),
  the drafters' kernel;
- the embedded gguf verifier's step of 1, 9 and 17 tokens after ``--context`` cached positions.
Prints each one's median ms [10th-90th percentile] and the ratio of medians off / on.  One thread.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from specui import kernels
from specui.kernels import packing
from specui.kernels.library import Kernel
from specui.verifier.model import Verifier


def spread(times: list[float]) -> str:
    lo, mid, hi = np.percentile(np.array(times) * 1e3, [10, 50, 90])
    return f"{mid:8.2f} [{lo:.2f}, {hi:.2f}]"


def compare(name: str, run: Callable[[], None], kernel: Kernel, repeats: int) -> None:
    default = kernel.set_prefetch_ahead(0)
    kernel.set_prefetch_ahead(default)
    times: dict[int, list[float]] = {0: [], default: []}
    run()
    for _ in range(repeats):
        for ahead in times:
            kernel.set_prefetch_ahead(ahead)
            t = time.perf_counter()
            run()
            times[ahead].append(time.perf_counter() - t)
    kernel.set_prefetch_ahead(default)
    ratio = statistics.median(times[0]) / statistics.median(times[default])
    print(f"{name:<26} {spread(times[0])} {spread(times[default])}   {ratio:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--context", type=int, default=256)
    a = ap.parse_args()
    torch.set_num_threads(1)
    kernel = kernels.load()
    if kernel is None or not kernels.bf16_kernel_available():
        raise SystemExit("the kernels do not run here")
    print(f"{'':<26} {'off: ms [p10, p90]':>22} {'on: ms [p10, p90]':>22}   off / on")

    gen = torch.Generator().manual_seed(0)
    weights = [
        packing.pack_bf16(torch.randn(3072, 576, generator=gen).to(torch.bfloat16))
        for _ in range(20)
    ]
    rows = torch.randn(8, 576, generator=gen).to(torch.bfloat16)

    def stream() -> None:
        for w in weights:
            kernel.bf16_matmul(rows, w, None)

    compare("bf16, 8 rows, 70 MB", stream, kernel, a.repeats)

    v = Verifier.load("embedded", precision="gguf")
    ids = torch.randint(100, v.vocab_size, (a.context + 17,), generator=gen)
    cache = v.new_cache()
    with torch.inference_mode():
        v.forward(ids[: a.context], cache, logits=False)
        for n in (1, 9, 17):

            def step(n: int = n) -> None:
                with torch.inference_mode():
                    v.forward(ids[a.context : a.context + n], cache)
                    v.crop(cache, a.context)

            compare(f"gguf verify, {n} tokens", step, kernel, a.repeats)


if __name__ == "__main__":
    main()
