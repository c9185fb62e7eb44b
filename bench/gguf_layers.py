"""The gguf verifier's step with its decoder layers in one C call against the torch ops (by hand).

    PYTHONPATH=. .venv/bin/python bench/gguf_layers.py [--repeats 20] [--context 256]

Loads the embedded verifier in ``gguf`` and times verify blocks of 1, 3, 5, 9 and 17 tokens
after ``--context`` cached positions, once through ``specui.verifier.gguf_layers`` (every layer
in ``specui_decoder_layers``) and once through ``specui.verifier.decoder``'s torch ops between the
same gguf matmuls, interleaved repeat by repeat so that drift on a loaded machine hits both
alike.  Prints each path's median ms, its 10th-90th percentile, and the ratio of the medians.
One torch thread.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from specui.verifier.model import Verifier

BLOCKS = (1, 3, 5, 9, 17)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--context", type=int, default=256)
    a = ap.parse_args()
    torch.set_num_threads(1)
    v = Verifier.load("embedded", precision="gguf")
    fast = v._fast  # the decoder Verifier.forward runs; its gguf_layers is the one-call path
    one_call = fast.gguf_layers if fast is not None else None
    if one_call is None:
        raise SystemExit("the one-call gguf layers do not run here (no AVX512 kernel?)")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, v.vocab_size, (a.context + max(BLOCKS),), generator=gen)
    cache = v.new_cache()
    v.forward(ids[: a.context], cache, logits=False)
    paths = {"torch ops": None, "one call": one_call}
    times: dict[tuple[str, int], list[float]] = {(p, n): [] for p in paths for n in BLOCKS}
    for _ in range(a.repeats + 1):  # the first repeat warms up and is dropped
        for name, layers in paths.items():
            fast.gguf_layers = layers
            for n in BLOCKS:
                t0 = time.perf_counter()
                v.forward(ids[a.context : a.context + n], cache)
                times[(name, n)].append(time.perf_counter() - t0)
                v.crop(cache, a.context)
    fast.gguf_layers = one_call
    print(f"gguf verify after {a.context} cached tokens, median [p10, p90] ms of {a.repeats}")
    print(f"{'tokens':>6} {'torch ops':>22} {'one call':>22} {'speedup':>8}")
    for n in BLOCKS:
        cells = []
        for name in paths:
            t = np.array(times[(name, n)][1:]) * 1e3
            cells.append(
                f"{np.median(t):7.1f} [{np.percentile(t, 10):5.1f}, {np.percentile(t, 90):5.1f}]"
            )
        ratio = statistics.median(times[("torch ops", n)][1:]) / statistics.median(
            times[("one call", n)][1:]
        )
        print(f"{n:>6} {cells[0]:>22} {cells[1]:>22} {ratio:>7.2f}x")


if __name__ == "__main__":
    main()
