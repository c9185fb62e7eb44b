"""A newcomer's first look, measured in a real browser: the Playground as it opens (its default
speculator, ``workbench.PLAYGROUND_SPECULATOR``, and its default settings) on "Explain why the
sky is blue in two sentences.", against plain decoding of the same prompt.

    .venv/bin/python bench/newcomer.py [--repeats 5] [--modes race,alternate]

Starts ``app.py`` on a fresh data folder, waits for its start-up preload, opens the Playground
in headless Chromium and types the prompt.  Then, per repeat:

* ``race``: "Side by side" ticked, its second speculator left on "none" (plain decoding); one
  Generate decodes both lanes step by step in turn, and each lane's tok/s is read off the page;
* ``alternate``: the speculator alone, then "none" alone (the order swapped every repeat), the
  tok/s each Generate shows.

The figures are the page's own (tokens over the run's draft and verify time).  The first round
after start-up is reported apart (it loads the drafter); the medians are over the repeats after
it, with the speculator / plain ratio's 95% bootstrap interval over repeats (paired by repeat).
Quote it from a quiet machine (``/work/scratch/quiet.sh`` or alike): speed is measured here,
not in the tests.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ui_latency import wait_for_preload  # noqa: E402
from tests.support.app_server import launch_chromium, running_app  # noqa: E402
from tests.support.playground_race import (  # noqa: E402
    generate,
    open_as_a_newcomer,
    pick,
    side_by_side,
)

PLAIN = "none"


def interval(ratios: list[float], resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of the median ratio over repeats."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return meds[int(0.025 * resamples)], meds[int(0.975 * resamples) - 1]


def report(mode: str, speculator: str, rounds: list[tuple[float, float]]) -> None:
    (first_spec, first_plain), warm = rounds[0], rounds[1:]
    spec = [s for s, _ in warm]
    plain = [p for _, p in warm]
    ratios = [s / p for s, p in warm]
    lo, hi = interval(ratios)
    print(
        f"{mode}: {speculator} median {statistics.median(spec):.1f} tok/s, plain median"
        f" {statistics.median(plain):.1f} tok/s over {len(warm)} repeats; ratio median"
        f" {statistics.median(ratios):.3f}x [95% CI {lo:.3f}, {hi:.3f}]"
    )
    print(f"  per repeat {speculator} / plain: {', '.join(f'{r:.3f}' for r in ratios)}")
    print(
        f"  first round after start-up: {speculator} {first_spec:.1f}, plain {first_plain:.1f}"
        " tok/s"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--modes", default="race,alternate", help="race, alternate or both")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"race", "alternate"}:
        raise SystemExit(f"--modes: race and/or alternate, got {args.modes!r}")
    from playwright.sync_api import sync_playwright

    results: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as d, running_app(Path(d)) as url, sync_playwright() as p:
        preload = wait_for_preload(Path(d) / "app.log")
        browser = launch_chromium(p, shutil.which("chromium") or "chromium")
        page = browser.new_page()
        page.set_default_timeout(300_000)
        speculator = open_as_a_newcomer(page, url)
        print(f"start-up preload: {preload:.1f} s; the Playground opens on {speculator!r}")
        for rep in range(args.repeats + 1):  # round 0: the first after start-up
            for mode in modes:
                if mode == "race":
                    side_by_side(page, True)
                    lanes = generate(page, ("a", "b"))
                    side_by_side(page, False)
                    shown = [lanes["a"], lanes["b"]]
                else:
                    order = [speculator, PLAIN] if rep % 2 == 0 else [PLAIN, speculator]
                    shown = []
                    for name in order:
                        pick(page, name)
                        shown.append(generate(page, ("a",))["a"])
                    pick(page, speculator)
                    shown.sort(key=lambda lane: lane[0] == PLAIN)  # the speculator first
                if rep == 0:
                    print(f"{mode}: the lanes show {[name for name, _ in shown]}")
                results[mode].append((shown[0][1], shown[1][1]))
        browser.close()
    for mode in modes:
        report(mode, speculator, results[mode])


if __name__ == "__main__":
    main()
