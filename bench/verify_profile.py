"""Where a verify block's milliseconds go, part by part (run by hand; issue 48's profile).

    PYTHONPATH=. .venv/bin/python bench/verify_profile.py [--precisions gguf,int8]
        [--rows 1,9,17] [--context 256] [--attention-contexts 256,1024,2048] [--repeats 15]

Loads the embedded verifier once per precision and, for each row count, times

- the whole verifier step (``Verifier.forward`` of that many tokens after ``--context`` cached
  positions, the cache cropped back after each);
- each matmul family on its own, over all 30 layers in turn (so the weights stream from memory
  as in a step): the fused q/k/v, the attention output, the fused gate/up and the down
  projection, with the step's own matmul and activation preparation;
- the LM head (the tied embedding, 49k x 576);
- attention, over every layer's cache, at each ``--attention-contexts`` length;

and prints each part's median ms and its share of the step.  "The rest" is the step less the
parts: norms, rotary, SiLU, residual adds, KV writes, the Python and ctypes around the calls.
The parts are timed alone, from caches as warm as a step leaves them; the step's own number is
what counts.  Interleaved repeat by repeat, so drift on a loaded machine hits every part alike.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from specui.verifier.model import Verifier


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: first-touch of buffers, the kernel's lazy set-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _step_ms(verifier: Verifier, rows: int, context: int, repeats: int) -> float:
    """The whole verifier step of ``rows`` tokens after ``context`` cached ones."""
    gen = torch.Generator().manual_seed(0)
    cache = verifier.new_cache()
    verifier.forward(torch.randint(100, 20000, (context,), generator=gen), cache, logits=False)
    block = torch.randint(100, 20000, (rows,), generator=gen)

    def step() -> None:
        verifier.forward(block, cache)
        verifier.crop(cache, context)

    return _median_ms(step, repeats)


def _parts(verifier: Verifier, rows: int, context: int, repeats: int) -> dict[str, float]:
    fast = verifier._fast
    if fast is None:
        raise SystemExit(f"{verifier.precision}: the fast decoder does not run here")
    gen = torch.Generator().manual_seed(0)
    cfg = fast.config
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    x = torch.randn(rows, hidden, generator=gen)
    xi = torch.randn(rows, inter, generator=gen)
    ready, ready_i = fast.rows(x), fast.rows(xi)
    mm = fast.mm

    def family(name: str, inp) -> Callable[[], None]:
        def run() -> None:
            for layer in fast.layers:
                mm(inp, getattr(layer, name), rows)

        return run

    # Time preparing the activations too: it is part of every matmul's cost in the step.
    def prepare() -> None:
        for _ in fast.layers:
            fast.rows(x), fast.rows(x), fast.rows(x), fast.rows(xi)

    out = {
        "step": _step_ms(verifier, rows, context, repeats),
        "q/k/v": _median_ms(family("qkv", ready), repeats),
        "attention output": _median_ms(family("o", ready), repeats),
        "gate/up": _median_ms(family("gate_up", ready), repeats),
        "down": _median_ms(family("down", ready_i), repeats),
        "activation prep (x4 a layer)": _median_ms(prepare, repeats),
        "LM head": _median_ms(lambda: mm(ready, fast.head, rows), repeats),
    }
    return out


def _attention_ms(verifier: Verifier, rows: int, context: int, repeats: int) -> float:
    fast = verifier._fast
    gen = torch.Generator().manual_seed(1)
    d, nh, kvh = fast.head_dim, fast.heads, fast.kv_heads
    q = torch.randn(rows, nh, d, generator=gen)
    keys = torch.randn(len(fast.layers), kvh, context + rows, d, generator=gen)
    values = torch.randn(len(fast.layers), kvh, context + rows, d, generator=gen)
    scale = fast.layers[0].scaling

    def run() -> None:
        for i in range(len(fast.layers)):
            fast._attention(q, keys[i], values[i], scale, context)

    return _median_ms(run, repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", default="gguf,int8")
    ap.add_argument("--rows", default="1,9,17")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--attention-contexts", default="256,1024,2048")
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows_list = [int(r) for r in a.rows.split(",")]
    contexts = [int(c) for c in a.attention_contexts.split(",")]
    for precision in a.precisions.split(","):
        verifier = Verifier.load("embedded", precision=precision)
        print(f"\n## {precision} (runs as {verifier.precision}), {a.context} cached tokens\n")
        table = {r: _parts(verifier, r, a.context, a.repeats) for r in rows_list}
        att = {
            (r, c): _attention_ms(verifier, r, c, a.repeats) for r in rows_list for c in contexts
        }
        head = "| part | " + " | ".join(f"{r} rows: ms (share)" for r in rows_list) + " |"
        print(head)
        print("|---" * (len(rows_list) + 1) + "|")
        names = [n for n in table[rows_list[0]] if n != "step"]
        for name in names:
            cells = [
                f"{table[r][name]:.2f} ({table[r][name] / table[r]['step']:.0%})" for r in rows_list
            ]
            print(f"| {name} | " + " | ".join(cells) + " |")
        cells = []
        for r in rows_list:
            att_here = att[(r, a.context)] if (r, a.context) in att else float("nan")
            cells.append(f"{att_here:.2f} ({att_here / table[r]['step']:.0%})")
        print(f"| attention ({a.context} keys) | " + " | ".join(cells) + " |")
        cells = []
        for r in rows_list:
            parts = sum(v for k, v in table[r].items() if k != "step")
            rest = table[r]["step"] - parts - att.get((r, a.context), 0.0)
            cells.append(f"{rest:.2f} ({rest / table[r]['step']:.0%})")
        print("| the rest (norms, rotary, SiLU, KV writes, Python) | " + " | ".join(cells) + " |")
        print("| **step** | " + " | ".join(f"**{table[r]['step']:.2f}**" for r in rows_list) + " |")
        print(
            "\nx the 1-row step: "
            + ", ".join(
                f"{r} rows {table[r]['step'] / table[rows_list[0]]['step']:.2f}" for r in rows_list
            )
        )
        print("\nattention over all layers at more cached tokens, ms (share of that step):")
        for c in contexts:
            cells = []
            for r in rows_list:
                step = _step_ms(verifier, r, c, a.repeats)
                cells.append(f"{r} rows {att[(r, c)]:.2f} of {step:.2f} ({att[(r, c)] / step:.0%})")
            print(f"- {c} keys: " + ", ".join(cells))


if __name__ == "__main__":
    main()
