"""The Playground driven as a newcomer drives it, in a real browser: the prompt typed, Generate
clicked, and the tok/s each lane shows read off the page.  ``bench/newcomer.py`` times the
speculator the Playground opens with against plain decoding this way; a browser test in
``tests/ui/test_app.py`` checks that the figures are there and parse."""

from __future__ import annotations

import re

NEWCOMER_PROMPT = "Explain why the sky is blue in two sentences."
SIDE_BY_SIDE = "Side by side: a second speculator, same prompt and seed"
# A lane's stats: "<name> (run <id>)" on the first line, "<x> tok/s · draft ..." further down.
HEAD = re.compile(r"^\s*(\S+) \(run (\d+)\)")
TOK_S = re.compile(r"([0-9]+(?:\.[0-9]+)?) tok/s")


def lane_figures(page, lane: str) -> tuple[str, int, float]:
    """(speculator, run id, tok/s) as lane ``lane`` ("a" or "b") shows them."""
    text = page.locator(f"#stats-{lane}").inner_text()
    head, rate = HEAD.search(text), TOK_S.search(text)
    if head is None or rate is None:
        raise AssertionError(f"lane {lane} shows no speculator, run or tok/s: {text!r}")
    return head.group(1), int(head.group(2)), float(rate.group(1))


def _lane_done(lane: str, after_run: int) -> str:
    """JS: lane ``lane`` shows a finished run newer than ``after_run``."""
    return (
        "() => { const t = document.querySelector('#stats-" + lane + "')?.innerText || '';"
        " const m = t.match(/\\(run (\\d+)\\)/);"
        f" return m && Number(m[1]) > {after_run} && t.includes('done ('); }}"
    )


def generate(
    page, lanes: tuple[str, ...] = ("a",), timeout_ms: float = 300_000
) -> dict[str, tuple[str, float]]:
    """Click Generate and wait until every lane in ``lanes`` shows a finished run newer than
    the one it showed; returns {lane: (speculator, tok/s)} as the page shows them."""
    before = {}
    for lane in lanes:
        try:
            before[lane] = lane_figures(page, lane)[1]
        except AssertionError:
            before[lane] = -1  # nothing shown yet
    page.locator("#generate").click()
    for lane in lanes:
        page.wait_for_function(_lane_done(lane, before[lane]), polling=50, timeout=timeout_ms)
    page.wait_for_function(
        "() => document.querySelector('#status')?.innerText.includes('done')",
        polling=50,
        timeout=timeout_ms,
    )
    out = {}
    for lane in lanes:
        name, _, rate = lane_figures(page, lane)
        out[lane] = (name, rate)
    return out


def open_as_a_newcomer(page, url: str) -> str:
    """Open the Playground, type the newcomer's prompt; returns the speculator it opened on."""
    page.goto(url)
    page.wait_for_selector("#generate")
    page.locator("#prompt textarea").fill(NEWCOMER_PROMPT)
    return page.locator("#drafter-a input").first.input_value()


def pick(page, speculator: str) -> None:
    """Choose the Playground's (first) speculator."""
    page.locator("#drafter-a input").first.fill(speculator)
    page.locator("#drafter-a input").first.press("Enter")


def side_by_side(page, on: bool) -> None:
    """Tick or untick "Side by side" (its second speculator opens on "none": plain decoding)."""
    box = page.get_by_label(SIDE_BY_SIDE)
    if on:
        box.check()
    else:
        box.uncheck()
