"""Does ``torch.compile`` make a verifier step cheaper?  The int8 step, eager against compiled.

Run by hand:

    PYTHONPATH=. .venv/bin/python bench/step_compile.py [--repeats 20] [--context 256]
        [--cpp-wrapper]

``specui/verifier/decoder.py`` runs a step as eager elementwise ops between oneDNN matmuls.
This bench compiles those stretches with inductor (dynamic shapes) and times the result against
the eager ``FastDecoder`` on the same weights and the same cached context, in one run:

- the first layer's norm, row quantization, fused q/k/v matmul and rotary: one graph;
- from one layer's attention output to the next layer's q/k/v (o-proj, residual, norm, MLP,
  residual, the next norm, q/k/v, rotary): one graph, called 29 times;
- the last layer's o-proj and MLP with the final norm and the LM head: one graph.

Attention stays eager: each query row runs on its own over exactly the keys it may see (a
Python loop over the block, which would specialise a graph to every block size).  A one-token
step is padded to two rows, so one row and a block run the same compiled kernels; dynamo
specialises size 1, and a graph of its own could sum a row in another order.  inductor lowers
``onednn::qlinear_pointwise`` only for weights frozen into the graph, so the matmul is wrapped
in an opaque custom op here and stays the exact same oneDNN call.

Printed: the compile time (first calls of each shape), whether a block's logits equal the same
tokens' one-token logits bit for bit, how far compiled logits are from eager ones, and ms per
step at 1 and 9 tokens (interleaved; medians over repeats with 95% bootstrap intervals, and the
median of paired ratios compiled / eager).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from bench.engine_peer import interval
from specui.kernels.packing import Int8Weight
from specui.verifier.batch_invariant import quantize_rows
from specui.verifier.decoder import FastDecoder, KVBuffer, rms_norm, rotate
from specui.verifier.model import Verifier


@torch.library.custom_op("specui_bench::int8_mm", mutates_args=())
def _int8_mm(
    q: torch.Tensor, packed: torch.Tensor, w_scale: torch.Tensor, w_zero: torch.Tensor
) -> torch.Tensor:
    return torch.ops.onednn.qlinear_pointwise(
        q, 1.0, 128, packed, w_scale, w_zero, None, 1.0, 0, torch.float32, "none", [], ""
    )


@_int8_mm.register_fake
def _(
    q: torch.Tensor, packed: torch.Tensor, w_scale: torch.Tensor, w_zero: torch.Tensor
) -> torch.Tensor:
    return q.new_empty((q.shape[0], w_scale.shape[0]), dtype=torch.float32)


def _mm(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    # specui.verifier.batch_invariant.int8_matmul on float32 rows, with oneDNN's matmul opaque
    # to inductor.
    q, scale = quantize_rows(x)
    out = _int8_mm(q, w.onednn, w.scale, w.zero_points) * scale
    return out if w.bias is None else out + w.bias


class CompiledInt8Step:
    """``FastDecoder.forward`` for an int8 verifier with the stretches between attentions
    compiled."""

    def __init__(self, fd: FastDecoder) -> None:
        if fd.layers[0].qkv is None:
            raise SystemExit("the verifier is not int8 (load it with precision='int8')")
        self.fd = fd
        nh, kvh, d = fd.heads, fd.kv_heads, fd.head_dim

        def qkv(h, ln1, eps1, w_qkv, cos, sin):
            n = h.shape[0]
            q, k, v = _mm(rms_norm(h, ln1, eps1), w_qkv).split((nh * d, kvh * d, kvh * d), dim=-1)
            q, k = q.reshape(n, nh, d), k.reshape(n, kvh, d)
            return rotate(q, cos, sin), rotate(k, cos, sin), v.reshape(n, kvh, d)

        def mlp(h, attn, o, ln2, eps2, gate_up, down):
            h = h + _mm(attn, o)
            gate, up = _mm(rms_norm(h, ln2, eps2), gate_up).chunk(2, dim=-1)
            return h + _mm(F.silu(gate) * up, down)

        def between(h, attn, o, ln2, eps2, gate_up, down, ln1, eps1, w_qkv, cos, sin):
            h = mlp(h, attn, o, ln2, eps2, gate_up, down)
            return (h, *qkv(h, ln1, eps1, w_qkv, cos, sin))

        def last(h, attn, o, ln2, eps2, gate_up, down, norm, eps, head):
            return _mm(rms_norm(mlp(h, attn, o, ln2, eps2, gate_up, down), norm, eps), head)

        self.first, self.between, self.last = (
            torch.compile(f, dynamic=True) for f in (qkv, between, last)
        )

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVBuffer) -> torch.Tensor:
        """Logits of every row of ``ids`` (float32 ``[n, V]``) after ``cache``'s positions."""
        fd, layers = self.fd, self.fd.layers
        n, start = ids.shape[0], cache.length
        end = start + n
        cache.reserve(end)
        kv = cache.data
        cos, sin = fd.cos[start:end], fd.signed_sin[start:end]
        rows = max(n, 2)  # one row padded to two: one set of compiled kernels for every size
        h = F.embedding(ids.expand(rows) if n == 1 else ids, fd.embed)
        cos, sin = cos.expand(rows, -1, -1), sin.expand(rows, -1, -1)
        q, k, v = self.first(h, layers[0].ln1, layers[0].eps1, layers[0].qkv, cos, sin)
        for i, layer in enumerate(layers):
            kv[i, 0, :, start:end] = k[:n].transpose(0, 1)
            kv[i, 1, :, start:end] = v[:n].transpose(0, 1)
            attn = fd._attention(q[:n], kv[i, 0, :, :end], kv[i, 1, :, :end], layer.scaling, start)
            attn = attn.expand(rows, -1)
            args = (h, attn, layer.o, layer.ln2, layer.eps2, layer.gate_up, layer.down)
            if i + 1 < len(layers):
                nxt = layers[i + 1]
                h, q, k, v = self.between(*args, nxt.ln1, nxt.eps1, nxt.qkv, cos, sin)
            else:
                logits = self.last(*args, *fd.final_norm, fd.head)
        cache.length = end
        return logits[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--cpp-wrapper",
        action="store_true",
        help="inductor's C++ wrapper (less Python per call, longer compile)",
    )
    a = ap.parse_args()
    # The question was asked of the eager step around oneDNN's matmuls (what the decoder ran
    # before specui.kernels), so that is the step compiled, unless told otherwise.
    os.environ.setdefault("SPECUI_CPU_KERNELS", "0")
    torch.set_num_threads(a.threads)
    torch._inductor.config.cpp_wrapper = a.cpp_wrapper
    v = Verifier.load("embedded", precision="int8")
    fd = v._fast
    if fd is None:
        raise SystemExit(
            "the int8 verifier does not run through specui.verifier.decoder.FastDecoder here"
        )
    compiled = CompiledInt8Step(fd)
    ids = torch.randint(
        100, v.vocab_size, (a.context + 9,), generator=torch.Generator().manual_seed(0)
    )
    eager_cache, compiled_cache = fd.new_cache(), fd.new_cache()
    for cache in (eager_cache, compiled_cache):
        fd.forward(ids[: a.context], cache, set(), keep=1)
    block = ids[a.context :]

    t0 = time.perf_counter()
    for n in (1, 9):
        compiled.forward(block[:n], compiled_cache)
        compiled_cache.crop(a.context)
    print(
        f"compile (first 1- and 9-token calls, cpp_wrapper={a.cpp_wrapper}): "
        f"{time.perf_counter() - t0:.1f} s"
    )

    with torch.inference_mode():
        singles = []
        for r in range(9):
            singles.append(compiled.forward(block[r : r + 1], compiled_cache))
        singles = torch.cat(singles)
        compiled_cache.crop(a.context)
        together = compiled.forward(block, compiled_cache)
        compiled_cache.crop(a.context)
        eager = torch.cat([fd.forward(block[r : r + 1], eager_cache, set())[0] for r in range(9)])
        eager_cache.crop(a.context)
    print(
        "compiled: 9-token block logits == the same tokens one at a time, bit for bit: "
        f"{torch.equal(together, singles)}"
    )
    print(
        "compiled against eager: max |logit difference| "
        f"{(singles - eager).abs().max().item():.2e}, "
        f"argmax equal {torch.equal(singles.argmax(-1), eager.argmax(-1))}"
    )

    print(
        f"\nint8 verifier step after {a.context} cached positions, {a.threads} thread(s), "
        f"{a.repeats} repeats, interleaved"
    )
    print("tokens  eager ms [95% CI]        compiled ms [95% CI]     compiled / eager")
    for n in (1, 9):
        walls: dict[str, list[float]] = {"eager": [], "compiled": []}
        for rep in range(a.repeats + 3):
            for name in walls:
                cache = eager_cache if name == "eager" else compiled_cache
                t = time.perf_counter()
                if name == "eager":
                    fd.forward(block[:n], cache, set())  # every row's logits, as a verify needs
                else:
                    compiled.forward(block[:n], cache)
                wall = time.perf_counter() - t
                cache.crop(a.context)
                if rep >= 3:  # warm-up
                    walls[name].append(wall * 1e3)
        e, c = interval(walls["eager"]), interval(walls["compiled"])
        ratio = statistics.median(
            x / y for x, y in zip(walls["compiled"], walls["eager"], strict=True)
        )
        print(
            f"{n:>6}  {e[0]:6.1f} [{e[1]:5.1f}, {e[2]:5.1f}]     "
            f"{c[0]:6.1f} [{c[1]:5.1f}, {c[2]:5.1f}]     {ratio:.2f}x"
        )


if __name__ == "__main__":
    main()
