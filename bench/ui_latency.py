"""Dashboard overhead, measured by hand in a real browser.

    .venv/bin/python bench/ui_latency.py [--repeats 3] [--max-new-tokens 64]

Starts ``app.py`` on a free port and waits for its start-up preload to end (the verifier
loaded, the cost model measured: the app logs "preloaded"); then times the first Generate after
start-up, what a first visitor sees, on the speculator the Playground opens with; then per
repeat: (1) times Generate in headless Chromium from the click to the first drafted step on
screen and to "done"; (2) times the same decode through the library (what the CLI runs) in
this process.  Prints the first Generate's time, the medians and the ratio UI / library of
total decode time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from specui.algorithms.simple import NgramDrafter  # noqa: E402
from specui.engine import generate  # noqa: E402
from specui.verifier.model import Verifier  # noqa: E402
from tests.support.app_server import running_app  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper and her cat."


def wait_for_preload(log: Path, timeout_s: float = 900.0) -> float:
    """Seconds until the app's log says its start-up preload ended (a fresh data folder builds
    the kernels and measures the cost model first)."""
    t0 = time.perf_counter()
    while "preloaded" not in log.read_text(errors="replace"):
        if time.perf_counter() - t0 > timeout_s:
            raise SystemExit(f"the app's preload did not end in {timeout_s:.0f} s; see {log}")
        time.sleep(0.5)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument(
        "--drafter", help="a speculator to pick (default: the one the Playground opens with)"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    from playwright.sync_api import sync_playwright

    v = Verifier.load("embedded")
    ids = v.encode(PROMPT, chat=True)
    first, ui_total, lib_total = [], [], []
    with tempfile.TemporaryDirectory() as d, running_app(Path(d)) as url, sync_playwright() as p:
        preload = wait_for_preload(Path(d) / "app.log")
        browser = p.chromium.launch(
            executable_path=shutil.which("chromium"), args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page()
        page.set_default_timeout(300_000)
        page.goto(url)
        page.locator("#prompt textarea").fill(PROMPT)
        page.locator("#max-new input[type=number]").fill(str(args.max_new_tokens))
        page.locator("#max-new input[type=number]").press("Enter")
        if args.drafter:
            page.locator("#drafter-a input").first.fill(args.drafter)
            page.locator("#drafter-a input").first.press("Enter")
        for rep in range(args.repeats + 1):  # the first round warms the app's model cache up
            t0 = time.perf_counter()
            page.locator("#generate").click()
            # The first update of a run carries its first step and sets the status to "decoding".
            page.wait_for_function(
                "() => document.querySelector('#status')?.innerText.includes('decoding')",
                polling=20,
            )
            t1 = time.perf_counter()
            page.wait_for_function(
                "() => document.querySelector('#status')?.innerText.includes('done')", polling=20
            )
            t2 = time.perf_counter()
            t3 = time.perf_counter()
            generate(v, NgramDrafter(4), ids, max_new_tokens=args.max_new_tokens)
            t4 = time.perf_counter()
            if rep == 0:
                cold = t1 - t0
            if rep:
                first.append(t1 - t0)
                ui_total.append(t2 - t0)
                lib_total.append(t4 - t3)
        browser.close()
    ui, lib = statistics.median(ui_total), statistics.median(lib_total)
    print(f"start-up preload: {preload:.1f} s after the page served")
    print(f"first Generate after start-up: click -> first step on screen {cold:.2f} s")
    print(f"click -> first drafted step on screen: median {statistics.median(first):.2f} s")
    print(
        f"decode {args.max_new_tokens} tokens: UI median {ui:.2f} s, library (CLI path) median"
        f" {lib:.2f} s, UI/library = {ui / lib:.2f}"
    )


if __name__ == "__main__":
    main()
