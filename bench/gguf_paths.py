"""The gguf matmul's two paths for Q4 blocks, in one run (by hand).

    PYTHONPATH=. .venv/bin/python bench/gguf_paths.py [--rows 1,5,9,17] [--repeats 15]

Every matmul of a decode step of the embedded verifier in the ``gguf`` precision (30 layers'
fused q/k/v, o, fused gate/up and down in Q4_1, then the Q8_0 head), one after another, so each
weight is read once a pass, as a step reads them (not hot in cache as a loop over one matrix
would have it).  Interleaved per repeat: ``specui_gguf_matmul_float`` (each 4-bit value made a
float) and ``specui_gguf_matmul`` (Q4 rows as three int8 pieces, ``vpdpbusd``).  Prints the
median ms of each, the integer path's speedup (median of per-repeat ratios, with the 10th-90th
percentile of those ratios), with and without the head (Q8_0 takes the float path in both).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import torch

from specui import kernels
from specui.verifier.model import Verifier


def one_pass(fn, weights: list, outs: list[torch.Tensor], xs: dict[int, torch.Tensor]) -> float:
    """ms for one call of ``fn`` on each weight in turn."""
    t0 = time.perf_counter()
    for w, o in zip(weights, outs, strict=True):
        x = xs[w.k]
        rows = (x.data_ptr(), x.shape[0], w.k)
        fn(w.type_id, *rows, w.data.data_ptr(), w.out_features, o.data_ptr())
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,5,9,17")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    kernel = kernels.load()
    if kernel is None:
        raise SystemExit(f"the gguf kernel does not run here: {kernels.status()}")
    v = Verifier.load("embedded", precision="gguf")
    layers = []
    for layer in v.model.model.layers:
        a, m = layer.self_attn, layer.mlp
        for w in (a.qkv_gguf, a.o_proj.weight_gguf, m.gate_up_gguf, m.down_proj.weight_gguf):
            layers.append(w.packed)
    head = v.model.lm_head.weight_gguf.packed
    float_path = kernel._lib.specui_gguf_matmul_float
    float_path.restype = ctypes.c_int
    float_path.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    paths = {"float": float_path, "integer": kernel._gguf}
    gen = torch.Generator().manual_seed(0)
    print(f"{len(layers)} Q4 matmuls + the {head.type} head, one thread; medians of {args.repeats}")
    print("rows  part         float ms  integer ms  integer speedup [p10, p90]")
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {w.k: torch.randn(rows, w.k, generator=gen) for w in (*layers, head)}
        for part, weights in (("layers", layers), ("layers+head", [*layers, head])):
            outs = [torch.empty(rows, w.out_features) for w in weights]

            for fn in paths.values():
                one_pass(fn, weights, outs, xs)  # warm: the library, the pages
            times = {name: [] for name in paths}
            for _ in range(args.repeats):
                for name, fn in paths.items():
                    times[name].append(one_pass(fn, weights, outs, xs))
            ratios = sorted(f / i for f, i in zip(times["float"], times["integer"], strict=True))
            p10, p90 = ratios[len(ratios) // 10], ratios[-1 - len(ratios) // 10]
            print(
                f"{rows:4d}  {part:11s}  {statistics.median(times['float']):8.2f}  "
                f"{statistics.median(times['integer']):10.2f}  "
                f"{statistics.median(ratios):.2f}x [{p10:.2f}, {p90:.2f}]"
            )


if __name__ == "__main__":
    main()
