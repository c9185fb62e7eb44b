"""The running dashboard: named API endpoints through gradio_client, and a real
browser (headless Chromium driven by Playwright) clicking through every tab.

Screenshots land in ``artifacts/screenshots/`` (one per tab)."""

from __future__ import annotations

import csv
import html
import io
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from specui.drafters.simple import NgramDrafter
from specui.engine import generate
from tests.app_server import running_app
from tests.conftest import REPO

SHOTS = REPO / "artifacts" / "screenshots"
PROMPT = "Repeat this sentence three times: the quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    data = tmp_path_factory.mktemp("appdata")
    with running_app(data) as url:
        yield url, data


def _text_of(output_html: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", output_html))


def test_generate_endpoint_matches_library_decoding(app_url, embedded_verifier):
    from gradio_client import Client

    url, _ = app_url
    client = Client(url, verbose=False)
    status, stats, out, steps, *_ = client.predict(
        "embedded", "ngram", "none", False, 4, 0, 1, 0, 32, PROMPT, True, "off", 0.5, api_name="/generate"
    )
    assert status.startswith("done"), status
    ids = embedded_verifier.encode(PROMPT, chat=True)
    expected = generate(embedded_verifier, NgramDrafter(4), ids, max_new_tokens=32)
    assert _text_of(out) == embedded_verifier.tokenizer.decode(expected.output_token_ids, skip_special_tokens=False)
    assert f"tau** (1 + accepted/drafts) **{expected.acceptance_length:.2f}" in stats
    assert 'class="tok accepted"' in steps


def test_decode_endpoint_returns_summary_and_stores_run(app_url, embedded_verifier):
    from gradio_client import Client

    from specui.store import Store

    url, data = app_url
    out = Client(url, verbose=False).predict(PROMPT, "ngram", "embedded", 4, 24, 0.0, 0, True, api_name="/decode")
    ids = embedded_verifier.encode(PROMPT, chat=True)
    expected = generate(embedded_verifier, NgramDrafter(4), ids, max_new_tokens=24)
    assert out["output_token_ids"] == expected.output_token_ids
    assert out["acceptance_length"] == pytest.approx(expected.acceptance_length)
    run = Store(data / "specui.db").get_run(out["run_id"])
    assert run.algorithm == "ngram" and str(run.status) == "done"


def test_generate_endpoint_rejects_empty_prompt(app_url):
    from gradio_client import Client

    client = Client(app_url[0], verbose=False)
    status, *_ = client.predict("embedded", "ngram", "none", False, 4, 0, 1, 0, 8, "   ", True, "off", 0.5,
                                api_name="/generate")
    assert "prompt is empty" in status


def test_compare_and_export_endpoints_match_the_store(app_url):
    from gradio_client import Client

    from specui.metrics import compare
    from specui.store import Store

    url, data = app_url
    client = Client(url, verbose=False)
    for drafter in ("none", "ngram"):
        client.predict("embedded", drafter, "none", False, 4, 0, 1, 0, 16, PROMPT, True, "off", 0.5, api_name="/generate")
    store = Store(data / "specui.db")
    ids = sorted(r.id for r in store.list_runs())[-2:]
    text = client.predict(f"{ids[0]},{ids[1]}", api_name="/export")
    rows = list(csv.DictReader(io.StringIO(text)))
    expected = compare(store, ids)
    api_rows = client.predict(" ".join(map(str, ids)), api_name="/compare")
    assert [r["run_id"] for r in api_rows] == [r["run_id"] for r in expected.rows]
    assert sorted(int(r["run_id"]) for r in rows) == ids
    by_id = {int(r["run_id"]): r for r in rows}
    for row in expected.rows:
        got = by_id[row["run_id"]]
        assert float(got["acceptance_length"]) == pytest.approx(row["acceptance_length"], rel=1e-6)
        assert got["drafter"] == row["drafter"]


# --- the browser ----------------------------------------------------------------------------


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def page(app_url):
    exe = _chromium()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (scripts/install_browser.sh installs it)")
        pytest.skip("chromium is not installed")
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        pg = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        pg.set_default_timeout(120_000)
        pg.goto(app_url[0])
        pg.wait_for_selector("#generate")
        yield pg
        browser.close()


def _tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def test_browser_playground_shows_accepted_and_rejected_tokens(page):
    _tab(page, "Playground")
    page.locator("#prompt textarea").fill(PROMPT)
    page.locator("#generate").click()
    page.wait_for_selector("#steps-a .tok.accepted")
    page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('done')", timeout=120_000)
    colours = {}
    for cls in ("accepted", "rejected", "corrected", "bonus"):
        loc = page.locator(f"#steps-a .tok.{cls}")
        if loc.count():
            colours[cls] = loc.first.evaluate("e => getComputedStyle(e).backgroundColor")
    assert "accepted" in colours and ("rejected" in colours or "corrected" in colours)
    assert len(set(colours.values())) == len(colours), colours  # distinct colours
    page.screenshot(path=str(SHOTS / "playground.png"), full_page=True)


def test_browser_stop_ends_the_run_as_stopped(page, app_url):
    from specui.store import Store

    _tab(page, "Playground")
    page.locator("#prompt textarea").fill("Write a long story about a lighthouse keeper.")
    page.locator("#max-new input[type=number]").fill("400")
    page.locator("#max-new input[type=number]").press("Enter")
    page.locator("#generate").click()
    page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('decoding')")
    page.locator("#stop").click()
    page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('done')", timeout=120_000)
    assert "cancelled" in page.locator("#stats-a").inner_text()
    run = Store(app_url[1] / "specui.db").list_runs(limit=1)[0]
    assert str(run.status) == "stopped"
    assert 0 < len(run_steps := Store(app_url[1] / "specui.db").get_steps(run.id)) < 400
    assert all(s.num_drafted >= 0 for s in run_steps)


def test_browser_train_start_and_cancel(page):
    _tab(page, "Train")
    page.locator("#train-name textarea, #train-name input").first.fill(f"ui-test-{int(time.time())}")
    page.locator("#train-steps input").fill("3")
    page.locator("#train-start").click()
    page.wait_for_function("() => document.querySelector('#train-started')?.innerText.includes('queued')")
    page.locator("#job-cancel").click()
    page.wait_for_function("() => /cancel/.test(document.querySelector('#job-status')?.innerText || '')", timeout=90_000)
    page.wait_for_function("() => document.querySelector('#job-status')?.innerText.includes('cancelled')", timeout=90_000)
    page.screenshot(path=str(SHOTS / "train.png"), full_page=True)


def test_browser_compare_two_runs_and_download_csv(page, app_url):
    from gradio_client import Client

    client = Client(app_url[0], verbose=False)
    for drafter in ("none", "ngram"):  # two runs to compare, whatever ran before
        client.predict(PROMPT, drafter, "embedded", 4, 8, 0.0, 0, True, api_name="/decode")
    _tab(page, "Compare")
    page.get_by_role("button", name="Refresh").click()
    boxes = page.locator("#runs input[type=checkbox]")
    page.wait_for_function("() => document.querySelectorAll('#runs input[type=checkbox]').length >= 2")
    boxes.nth(0).check()
    boxes.nth(1).check()
    page.locator("#compare").click()
    page.wait_for_selector("#comparison table")
    page.wait_for_function("() => !document.querySelector('#download-csv')?.disabled")
    with page.expect_download() as dl:
        page.locator("#download-csv").click()
    text = Path(dl.value.path()).read_text(encoding="utf-8")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 2
    assert {"run_id", "acceptance_length", "speedup", "tokens_per_s"} <= set(rows[0])
    assert all(float(r["acceptance_length"]) >= 1.0 for r in rows)
    page.screenshot(path=str(SHOTS / "compare.png"), full_page=True)


def test_browser_speculators_tab(page):
    _tab(page, "Speculators")
    page.screenshot(path=str(SHOTS / "speculators.png"), full_page=True)
    assert page.get_by_role("button", name="vLLM serve command").is_visible()
