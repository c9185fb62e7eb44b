"""The verify curve: what a verifier step of 1 to 17 rows costs, old and new kernel in one run.

    PYTHONPATH=. .venv/bin/python bench/verify_curve.py [--precisions gguf,gguf-q8]
        [--max-rows 17] [--context 256] [--repeats 15] [--svg docs/verify-curve.svg] [--json F]

Loads the embedded verifier once per precision and times ``Verifier.forward`` of N tokens after
``--context`` cached ones (the cache cropped back after each), for N = 1..``--max-rows``,
interleaved precision by precision and N by N in every repeat, so that drift on a loaded machine
hits all alike.  Prints each one's median ms with its 10th-90th percentile and the multiple of
its own one-row step (what decides whether speculation pays: a verify of K drafts + 1 costs that
many one-token steps), and draws both curves as an SVG.  One torch thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specui.verifier.model import Verifier

COLOURS = ("#888888", "#1f77b4", "#d62728", "#2ca02c")


def _percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def measure(
    precisions: list[str], max_rows: int, context: int, repeats: int
) -> dict[str, dict[int, list[float]]]:
    """``{precision: {rows: [ms, ...]}}``, every repeat of every point interleaved."""
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 20000, (context,), generator=gen)
    block = torch.randint(100, 20000, (max_rows,), generator=gen)
    loaded = []
    for p in precisions:
        v = Verifier.load("embedded", precision=p)
        if v.precision != p:
            raise SystemExit(f"{p} does not run here (loaded as {v.precision})")
        cache = v.new_cache()
        v.forward(prompt, cache, logits=False)
        loaded.append((p, v, cache))
    times: dict[str, dict[int, list[float]]] = {
        p: {n: [] for n in range(1, max_rows + 1)} for p in precisions
    }
    for rep in range(repeats + 1):  # the first pass warms every path up and is not kept
        for n in range(1, max_rows + 1):
            for p, v, cache in loaded:
                t0 = time.perf_counter()
                v.forward(block[:n], cache)
                ms = (time.perf_counter() - t0) * 1e3
                v.crop(cache, context)
                if rep:
                    times[p][n].append(ms)
    return times


def svg(medians: dict[str, dict[int, float]], title: str) -> str:
    """Each precision's median ms against rows, with its multiple of the one-row step marked at
    9 and 17 rows; no plotting dependency."""
    w, h, left, top, right, bottom = 560, 340, 56, 34, 24, 52
    pw, ph = w - left - right, h - top - bottom
    max_rows = max(max(m) for m in medians.values())
    y1 = max(max(m.values()) for m in medians.values()) * 1.1

    def xy(n: int, ms: float) -> tuple[float, float]:
        return left + (n - 1) / (max_rows - 1) * pw, top + (1 - ms / y1) * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        'font-family="sans-serif">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{w / 2:.0f}" y="20" text-anchor="middle" font-size="14">{title}</text>',
    ]
    step = 10 if y1 > 40 else 5
    for v in range(0, int(y1) + 1, step):
        y = xy(1, v)[1]
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{v}</text>'
        )
    for n in range(1, max_rows + 1, 2):
        x = xy(n, 0)[0]
        out.append(
            f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle" font-size="11">{n}</text>'
        )
    out.append(
        f'<text x="{left + pw / 2}" y="{h - 12}" text-anchor="middle" font-size="12">rows in the'
        " verifier step (drafts + 1)</text>"
    )
    out.append(
        f'<text x="14" y="{top + ph / 2}" text-anchor="middle" font-size="12" transform="rotate(-90'
        f' 14 {top + ph / 2})">ms (median)</text>'
    )
    for i, (name, m) in enumerate(medians.items()):
        c = COLOURS[i % len(COLOURS)]
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(n, m[n]) for n in sorted(m)))
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{pts}"/>')
        for n in (9, max_rows):
            if n in m:
                x, y = xy(n, m[n])
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{c}"/>')
                out.append(
                    f'<text x="{x - 4:.1f}" y="{y - 8:.1f}" text-anchor="end" font-size="11" '
                    f'fill="{c}">{m[n] / m[1]:.2f}x</text>'
                )
        out.append(
            f'<text x="{left + 8}" y="{top + 14 + 16 * i}" font-size="12" fill="{c}">{name}'
            f" (1 row {m[1]:.1f} ms)</text>"
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", default="gguf,gguf-q8")
    ap.add_argument("--max-rows", type=int, default=17)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--svg", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    precisions = a.precisions.split(",")
    times = measure(precisions, a.max_rows, a.context, a.repeats)
    medians = {p: {n: statistics.median(t) for n, t in rows.items()} for p, rows in times.items()}
    print(f"verifier step after {a.context} cached tokens, median ms [p10, p90] (x its 1-row step)")
    print("| rows | " + " | ".join(precisions) + " |")
    print("|---" * (len(precisions) + 1) + "|")
    for n in range(1, a.max_rows + 1):
        cells = [
            f"{medians[p][n]:.2f} [{_percentile(times[p][n], 0.1):.2f}, "
            f"{_percentile(times[p][n], 0.9):.2f}] (x{medians[p][n] / medians[p][1]:.2f})"
            for p in precisions
        ]
        print(f"| {n} | " + " | ".join(cells) + " |")
    if len(precisions) > 1:
        base, new = precisions[0], precisions[-1]
        print(f"\n{new} 1-row step / {base}'s: {medians[new][1] / medians[base][1]:.2f}")
    if a.svg:
        a.svg.write_text(
            svg(medians, f"Verify cost, embedded SmolLM2, one thread, {a.context} cached")
        )
        print(f"wrote {a.svg}")
    if a.json:
        a.json.write_text(json.dumps({"context": a.context, "ms": times}, indent=1))


if __name__ == "__main__":
    main()
