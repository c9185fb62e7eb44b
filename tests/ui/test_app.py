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

from specui.algorithms.simple import NgramDrafter
from specui.engine import generate
from tests.support.app_server import launch_chromium, running_app
from tests.support.paths import REPO

SHOTS = REPO / "artifacts" / "screenshots"
PROMPT = "Repeat this sentence three times: the quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    data = tmp_path_factory.mktemp("appdata")
    # The campaign's folder: absent until a test makes a stage in it (the Train tab says so).
    with running_app(data, env={"SPECUI_CAMPAIGN_DIR": str(data / "campaign")}) as url:
        yield url, data


def _wait_for_text(page, selector: str, text: str, **kwargs) -> None:
    """Wait until the element at ``selector`` shows ``text`` (``kwargs``: wait_for_function's)."""
    page.wait_for_function(
        f"() => document.querySelector('{selector}')?.innerText.includes('{text}')", **kwargs
    )


def _text_of(output_html: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", output_html))


def test_generate_endpoint_matches_library_decoding(app_url, embedded_verifier):
    from gradio_client import Client

    url, _ = app_url
    client = Client(url, verbose=False)
    status, stats, out, steps, *_ = client.predict(
        "embedded",
        "ngram",
        "none",
        False,
        4,
        0,
        1,
        0,
        32,
        PROMPT,
        True,
        "off",
        0.5,
        "fixed",
        api_name="/generate",
    )
    assert status.startswith("done"), status
    ids = embedded_verifier.encode(PROMPT, chat=True)
    expected = generate(embedded_verifier, NgramDrafter(4), ids, max_new_tokens=32)
    assert _text_of(out) == embedded_verifier.tokenizer.decode(
        expected.output_token_ids, skip_special_tokens=False
    )
    assert f"tau** (1 + accepted/drafts) **{expected.acceptance_length:.2f}" in stats
    assert 'class="tok accepted"' in steps


def test_decode_endpoint_returns_summary_and_stores_run(app_url, embedded_verifier):
    from gradio_client import Client

    from specui.store import Store

    url, data = app_url
    out = Client(url, verbose=False).predict(
        PROMPT, "ngram", "embedded", 4, 24, 0.0, 0, True, api_name="/decode"
    )
    ids = embedded_verifier.encode(PROMPT, chat=True)
    expected = generate(embedded_verifier, NgramDrafter(4), ids, max_new_tokens=24)
    assert out["output_token_ids"] == expected.output_token_ids  # lossless under any policy
    run = Store(data / "specui.db").get_run(out["run_id"])
    assert run.algorithm == "ngram" and str(run.status) == "done"
    # The summary is the stored run's: how many drafts a step sent was the adaptive policy's
    # choice in the app's process (its learned rates), so it is read back, not recomputed here.
    from specui.metrics.comparison import compare

    stored = compare(Store(data / "specui.db"), [out["run_id"]]).rows[0]
    assert out["acceptance_length"] == pytest.approx(stored["acceptance_length"])


def test_generate_endpoint_rejects_empty_prompt(app_url):
    from gradio_client import Client

    client = Client(app_url[0], verbose=False)
    status, *_ = client.predict(
        "embedded",
        "ngram",
        "none",
        False,
        4,
        0,
        1,
        0,
        8,
        "   ",
        True,
        "off",
        0.5,
        "adaptive",
        api_name="/generate",
    )
    assert "prompt is empty" in status


def test_compare_and_export_endpoints_match_the_store(app_url):
    from gradio_client import Client

    from specui.metrics.comparison import compare
    from specui.store import Store

    url, data = app_url
    client = Client(url, verbose=False)
    for drafter in ("none", "ngram"):
        client.predict(
            "embedded",
            drafter,
            "none",
            False,
            4,
            0,
            1,
            0,
            16,
            PROMPT,
            True,
            "off",
            0.5,
            "adaptive",
            api_name="/generate",
        )
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
        browser = launch_chromium(p, exe)
        pg = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
        pg.set_default_timeout(120_000)
        pg.goto(app_url[0])
        pg.wait_for_selector("#generate")
        yield pg
        browser.close()


def _tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def test_browser_playground_shows_accepted_and_rejected_tokens(page, app_url):
    """The Playground opens on the fastest mode measured on Spec-Bench
    (``PLAYGROUND_SPECULATOR``); a fresh clone runs a SHIPPED drafter (DSpark, picked) with
    no training and no network: accepted / rejected tokens in distinct colours, and DSpark's
    confidence score beside each drafted token."""
    from specui.algorithms.resolve import shipped_drafters
    from specui.data import load_prompts
    from specui.store import Store
    from specui.workbench import PLAYGROUND_SPECULATOR

    assert "dspark" in shipped_drafters(), "the shipped drafters are missing from data/drafters"
    _tab(page, "Playground")
    chosen = page.locator("#drafter-a input").first.input_value()
    assert chosen == PLAYGROUND_SPECULATOR, f"the Playground preselects {chosen!r}"
    page.locator("#drafter-a input").first.fill("dspark")
    page.locator("#drafter-a input").first.press("Enter")
    # The toggle opens on the adaptive policy; this run shows the raw drafter at its K
    # ("fixed"): under the adaptive policy the shipped DSpark, too weak to pay on this CPU,
    # runs mostly plain steps, and which ones it drafts depends on this machine's cost model.
    assert page.locator("#decode-policy input:checked").first.input_value() == "adaptive"
    page.locator("#decode-policy").get_by_label("fixed").check()
    # A held-out prompt of the set the shipped drafters were trained on (their domain).
    page.locator("#prompt textarea").fill(
        load_prompts("gsm-symbolic", split="eval", limit=1)[0].text
    )
    page.locator("#generate").click()
    page.wait_for_selector("#steps-a .tok.accepted")
    _wait_for_text(page, "#status", "done", timeout=120_000)
    confidences = [float(t) for t in page.locator("#steps-a .tok sup.conf").all_inner_texts()]
    assert confidences and all(0.0 <= c <= 1.0 for c in confidences), confidences
    run = Store(app_url[1] / "specui.db").list_runs(limit=1)[0]
    assert (run.algorithm, str(run.status)) == ("dspark", "done"), (
        run.algorithm,
        run.status,
        run.drafter,
    )
    colours = {}
    for cls in ("accepted", "rejected", "corrected", "bonus"):
        loc = page.locator(f"#steps-a .tok.{cls}")
        if loc.count():
            colours[cls] = loc.first.evaluate("e => getComputedStyle(e).backgroundColor")
    assert "accepted" in colours and ("rejected" in colours or "corrected" in colours)
    assert len(set(colours.values())) == len(colours), colours  # distinct colours
    # The decoding policy the toggle shows is the one the run stored, and the cost curve the
    # adaptive policy chooses by is drawn in the Playground.
    assert page.locator("#decode-policy input:checked").first.input_value() == "fixed"
    assert run.settings["policy"] == "fixed"
    page.locator("#decode-policy").get_by_label("adaptive").check()  # the later tests' default
    page.locator("#cost-model").get_by_text("Cost model").first.click()
    page.wait_for_selector("#cost-plot .js-plotly-plot")
    _wait_for_text(page, "#cost-note", "Measured on this machine")
    page.screenshot(path=str(SHOTS / "playground.png"), full_page=True)


def test_browser_newcomer_race_shows_both_tok_s_figures(page, app_url):
    """A newcomer's page (a fresh one: the Playground's defaults), the newcomer's prompt, "Side
    by side" against plain decoding: both lanes show their speculator and a tok/s figure that
    parses, read as ``bench/newcomer.py`` reads them (it times them; this test does not)."""
    from specui.workbench import PLAYGROUND_SPECULATOR
    from tests.support.playground_race import generate, open_as_a_newcomer, side_by_side

    fresh = page.context.browser.new_page()
    try:
        fresh.set_default_timeout(120_000)
        assert open_as_a_newcomer(fresh, app_url[0]) == PLAYGROUND_SPECULATOR
        side_by_side(fresh, True)
        lanes = generate(fresh, ("a", "b"), timeout_ms=120_000)
        (spec, spec_rate), (plain, plain_rate) = lanes["a"], lanes["b"]
        assert spec.startswith(PLAYGROUND_SPECULATOR) and plain == "none", lanes
        assert spec_rate > 0 and plain_rate > 0, lanes
    finally:
        fresh.close()


def test_browser_stop_ends_the_run_as_stopped(page, app_url):
    from specui.store import Store

    _tab(page, "Playground")
    page.locator("#prompt textarea").fill("Write a long story about a lighthouse keeper.")
    page.locator("#max-new input[type=number]").fill("400")
    page.locator("#max-new input[type=number]").press("Enter")
    page.locator("#generate").click()
    _wait_for_text(page, "#status", "decoding")
    page.locator("#stop").click()
    _wait_for_text(page, "#status", "done", timeout=120_000)
    assert "cancelled" in page.locator("#stats-a").inner_text()
    run = Store(app_url[1] / "specui.db").list_runs(limit=1)[0]
    assert str(run.status) == "stopped"
    assert 0 < len(run_steps := Store(app_url[1] / "specui.db").get_steps(run.id)) < 400
    assert all(s.num_drafted >= 0 for s in run_steps)


def test_browser_train_start_and_cancel(page):
    _tab(page, "Train")
    page.locator("#train-name textarea, #train-name input").first.fill(
        f"ui-test-{int(time.time())}"
    )
    page.locator("#train-steps input").fill("3")
    page.locator("#train-start").click()
    _wait_for_text(page, "#train-started", "queued")
    page.locator("#job-cancel").click()
    page.wait_for_function(
        "() => /cancel/.test(document.querySelector('#job-status')?.innerText || '')",
        timeout=90_000,
    )
    _wait_for_text(page, "#job-status", "cancelled", timeout=90_000)
    page.screenshot(path=str(SHOTS / "train.png"), full_page=True)


def test_browser_train_tab_shows_only_the_picked_algorithms_options(page):
    """Each trainable algorithm of the registry, picked in the Train tab, shows the options it
    reads (its train_fields) and hides every other algorithm's."""
    from specui.algorithms.spec import algorithm, algorithm_names, train_knobs

    _tab(page, "Train")
    page.get_by_text("More algorithm options").click()
    options = [n for n in train_knobs() if n != "block_size"]  # block size / K: every algorithm's
    names = algorithm_names(trainable=True)
    seen = {}
    for name in [*names[1:], names[0]]:  # the first again last: the tab as the other tests find it
        page.locator("#train-algorithm input").click()
        page.get_by_role("option", name=name, exact=True).click()
        want = sorted(set(options) & set(algorithm(name).train_fields))
        deadline = time.monotonic() + 30
        while (
            shown := sorted(n for n in options if page.locator(f"#train-option-{n}").is_visible())
        ) != want:
            assert time.monotonic() < deadline, (
                f"{name}: the tab shows {shown}, the algorithm reads {want}"
            )
            time.sleep(0.2)
        seen[name] = shown
    assert len({tuple(v) for v in seen.values()}) > 1, seen  # the options did change with the pick


def test_browser_train_job_opens_its_checkpoint_in_the_playground(page, app_url):
    """A two-step job started in the tab with a held-out evaluation every step (the generated
    settings: max_new_tokens, eval_every), its held-out preview, and the Open button: the
    Playground opens on the job's final drafter.  The run, copied as a campaign stage, shows in
    the Campaign accordion."""
    from specui.store import Store

    _tab(page, "Train")
    name = f"ui-open-{int(time.time())}"
    page.locator("#train-name textarea, #train-name input").first.fill(name)
    page.locator("#train-steps input").fill("2")
    page.get_by_role("button", name="More training settings").click()
    assert page.locator("#train-setting-max_new_tokens input").input_value() == "128"
    assert page.locator("#train-setting-eval_every input").input_value() == "0"
    # The shipped general responses (n128): nothing to generate; a few seconds of training.
    settings = {"eval_every": "1", "eval_samples": "2", "num_prompts": "8", "checkpoint_every": "1"}
    for setting, value in settings.items():
        widget = page.locator(f"#train-setting-{setting}")
        widget.locator("textarea, input").first.fill(value)
    store = Store(app_url[1] / "specui.db")
    earlier = store.list_jobs(limit=1)  # an earlier test's job: the line says it was queued
    page.locator("#train-start").click()
    page.wait_for_function(
        "(old) => { const m = /^job (\\d+) queued$/.exec("
        "(document.querySelector('#train-started')?.innerText || '').trim());"
        " return m && Number(m[1]) !== old; }",
        arg=earlier[0].id if earlier else -1,
    )
    job = store.list_jobs(limit=1)[0]
    assert page.locator("#train-started").inner_text().strip() == f"job {job.id} queued"
    assert {k: job.params.get(k) for k in settings} == {k: int(v) for k, v in settings.items()}
    assert "max_new_tokens" not in job.params  # at its default: left out of the params
    # The optional numbers left empty stay unset (a drawn gr.Number would have sent 0).
    assert "draft_vocab_size" not in job.params and "mask_token_id" not in job.params
    _wait_for_text(page, "#job-status", "· done ·", timeout=300_000)
    _wait_for_text(page, "#job-heldout", "held-out expected acceptance length", timeout=30_000)
    assert "(every step, 2 evaluations)" in page.locator("#job-heldout").inner_text()

    page.screenshot(path=str(SHOTS / "train-heldout.png"), full_page=True)
    page.locator("#job-open-checkpoint").click()
    run = (app_url[1] / "speculators" / name).resolve()
    said = f"job {job.id}'s final drafter (step 2): {run}"
    page.wait_for_function(
        "(said) => document.querySelector('#job-open-status')?.innerText.includes(said)",
        arg=said,
    )
    page.wait_for_function(
        f"() => document.querySelector('#drafter-a input')?.value === {str(run)!r}",
        timeout=30_000,
    )
    assert page.get_by_role("tab", name="Playground").get_attribute("aria-selected") == "true"
    assert said in page.locator("#status").inner_text()  # the Playground says what it got
    page.screenshot(path=str(SHOTS / "train-open-checkpoint.png"), full_page=True)

    _tab(page, "Train")
    page.get_by_role("button", name="Campaign (read-only)").click()
    assert page.locator("#campaign-status").inner_text().startswith("no training campaign")
    stage = app_url[1] / "campaign" / "runs" / "dflash"
    stage.mkdir(parents=True)
    for f in ("metrics.jsonl", "train_run.json"):
        shutil.copy(run / f, stage / f)
    page.locator("#campaign-refresh").click()
    page.locator("#campaign-stage input").click()
    page.get_by_role("option", name="dflash", exact=True).click()
    _wait_for_text(page, "#campaign-status", "dflash · finished · step 2/2")
    _wait_for_text(page, "#campaign-heldout", "held-out expected acceptance length")


def test_browser_compare_two_runs_and_download_csv(page, app_url):
    from gradio_client import Client

    client = Client(app_url[0], verbose=False)
    for drafter in ("none", "ngram"):  # two runs to compare, whatever ran before
        client.predict(PROMPT, drafter, "embedded", 4, 8, 0.0, 0, True, api_name="/decode")
    _tab(page, "Compare")
    page.get_by_role("button", name="Refresh").click()
    boxes = page.locator("#runs input[type=checkbox]")
    page.wait_for_function(
        "() => document.querySelectorAll('#runs input[type=checkbox]').length >= 2"
    )
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


# Each header word's line boxes: a word split over two lines ("Algorit|hm") has two tops.
_SPLIT_HEADER_WORDS = """() => {
  const split = [];
  for (const th of document.querySelectorAll('#comparison .header-cell')) {
    const walker = document.createTreeWalker(th, NodeFilter.SHOW_TEXT);
    let node;
    while ((node = walker.nextNode())) {
      for (const m of node.data.matchAll(/\\S+/g)) {
        const r = document.createRange();
        r.setStart(node, m.index);
        r.setEnd(node, m.index + m[0].length);
        const tops = new Set(
          [...r.getClientRects()].filter(b => b.width > 0).map(b => Math.round(b.top)));
        if (tops.size > 1) split.push(m[0]);
      }
    }
  }
  return split;
}"""


def test_browser_compare_table_is_readable(page, app_url, embedded_verifier):
    from specui.algorithms.simple import PlainDrafter
    from specui.data import load_prompts
    from specui.metrics.comparison import compare
    from specui.service import DecodeRequest, record_runs
    from specui.store import Store

    _, data = app_url
    jsonl = REPO / "data" / "prompts" / "demo.jsonl"
    request = DecodeRequest(drafter="ngram", num_speculative_tokens=4, max_new_tokens=8)
    store = Store(data / "specui.db")  # the app's own store, written beside it (WAL)
    ids = [
        r.run_id
        for r in record_runs(
            store,
            embedded_verifier,
            [(PlainDrafter(), request), (NgramDrafter(4), request)],
            load_prompts(str(jsonl), limit=2),
            prompt_set=str(jsonl),
        )
    ]
    assert store.get_run(ids[0]).prompt_set == str(jsonl)  # stored whole; shown by its name
    _tab(page, "Compare")
    page.get_by_role("button", name="Refresh").click()
    _wait_for_text(page, "#runs", f"{ids[1]}: ngram-k4 · demo.jsonl")
    # what an earlier test left selected
    checked = page.locator("#runs input[type=checkbox]:checked")
    while checked.count():
        checked.first.uncheck()
    for rid, drafter in zip(ids, ("none", "ngram-k4"), strict=True):
        page.get_by_label(f"{rid}: {drafter} · demo.jsonl · done", exact=True).check()
    page.locator("#compare").click()
    page.wait_for_function(
        "() => document.querySelector('#comparison [data-testid=cell-1-0]')?.innerText.trim()"
        f" == '{ids[1]}'"
    )

    headers = [
        h.strip() for h in page.locator("#comparison .header-cell .header").all_inner_texts()
    ]
    assert "Wall time [s]" in headers and "Verifier weights" in headers
    assert page.evaluate(_SPLIT_HEADER_WORDS) == []  # no header word broken across lines

    def column(label: str) -> list[str]:
        i = headers.index(label)
        return [
            page.locator(f"#comparison [data-testid=cell-{r}-{i}]").inner_text().strip()
            for r in range(2)
        ]

    expected = {row["run_id"]: row for row in compare(store, ids).rows}
    walls = column("Wall time [s]")
    assert all(re.fullmatch(r"\d+(\.\d)?", w) for w in walls), walls  # seconds to 0.1
    assert walls == [f"{expected[rid]['wall_time_s']:.1f}" for rid in ids]
    assert all(re.fullmatch(r"\d+\.\d\d", t) for t in column("τ (acceptance length) [tokens/step]"))
    assert column("Output tokens [tokens]") == [
        str(expected[rid]["num_output_tokens"]) for rid in ids
    ]
    assert column("Prompt set") == ["demo.jsonl"] * 2
    assert column("Verifier weights") == [embedded_verifier.fingerprint[:8]] * 2

    # The CSV keeps every digit the table rounds away.
    page.wait_for_function("() => !document.querySelector('#download-csv')?.disabled")
    with page.expect_download() as dl:
        page.locator("#download-csv").click()
    rows = {
        int(r["run_id"]): r
        for r in csv.DictReader(io.StringIO(Path(dl.value.path()).read_text(encoding="utf-8")))
    }
    for rid in ids:
        assert float(rows[rid]["wall_time_s"]) == expected[rid]["wall_time_s"]
        assert (
            rows[rid]["prompt_set"] == str(jsonl)
            and rows[rid]["verifier_fingerprint"] == embedded_verifier.fingerprint
        )
    page.screenshot(path=str(SHOTS / "compare.png"), full_page=True)
    # The table scrolls sideways: the wall time and the rates, in view.
    page.locator(
        "#comparison [data-testid=cell-0-" + str(headers.index("Wall time [s]")) + "]"
    ).scroll_into_view_if_needed()
    page.locator("#comparison").screenshot(path=str(SHOTS / "compare-table.png"))
    store.close()


def test_browser_speculators_tab(page):
    _tab(page, "Speculators")
    page.screenshot(path=str(SHOTS / "speculators.png"), full_page=True)
    assert page.get_by_role("button", name="vLLM serve command").is_visible()


# --- /bench and replaying stored runs -------------------------------------------------------


def test_bench_endpoint_matches_store_and_library_decoding(app_url, embedded_verifier):
    from gradio_client import Client

    from specui.data import load_prompts
    from specui.metrics.comparison import compare
    from specui.store import Store

    url, data = app_url
    client = Client(url, verbose=False)
    out = client.predict("ngram", "demo", 1, 16, "embedded", 4, 0.0, 0, api_name="/bench")
    base_id, ngram_id = out["run_ids"]
    rows = {r["run_id"]: r for r in out["runs"]}
    store = Store(data / "specui.db")
    for row in compare(store, out["run_ids"]).rows:  # what the store holds, read back
        got = rows[row["run_id"]]
        for key in (
            "acceptance_length",
            "num_accepted_tokens",
            "num_drafts",
            "num_output_tokens",
            "speedup",
        ):
            assert got[key] == pytest.approx(row[key]), key
    # ... and what the library decodes on the same prompt
    ids = load_prompts("demo", split="eval", limit=1)[0].encode(embedded_verifier)
    # The endpoint decodes under the app's adaptive policy, whose choices follow the costs this
    # machine measured (a loaded machine drafts less): the tokens are the library's, greedy
    # and lossless; the drafting is compared where the library runs the same fixed K.
    expected = generate(embedded_verifier, NgramDrafter(4), ids, max_new_tokens=16)
    steps = [s.to_trace() for s in store.get_steps(ngram_id)]
    assert [t for s in steps for t in s.emitted_token_ids] == list(expected.output_token_ids)
    assert rows[ngram_id]["num_accepted_tokens"] == sum(s.num_accepted for s in steps)
    if '"policy": "fixed"' in store.get_run(ngram_id).settings_json:
        assert [s.num_accepted for s in steps] == [s.num_accepted for s in expected.steps]
    assert rows[base_id]["algorithm"] == "none" and rows[base_id]["acceptance_length"] == 1.0
    assert rows[ngram_id]["baseline_run_id"] == base_id and rows[ngram_id]["speedup"] > 0
    assert store.get_run(ngram_id).owner == client.session_hash  # the calling session owns its runs


def test_bench_endpoint_rejects_bad_input_with_the_library_message(app_url):
    from gradio_client import Client

    client = Client(app_url[0], verbose=False)
    with pytest.raises(Exception, match="unknown prompt set '/etc/passwd'"):
        client.predict("ngram", "/etc/passwd", 1, 16, "embedded", 4, 0.0, 0, api_name="/bench")
    with pytest.raises(Exception, match=r"limit must be in 1\.\.8"):
        client.predict("ngram", "demo", 100, 16, "embedded", 4, 0.0, 0, api_name="/bench")


def _embedded_texts():
    from specui.verifier.embedded import cache_dir
    from specui.vllm.request_steps import TokenTexts

    return TokenTexts(str(cache_dir() / "models" / "smollm2-135m-instruct"))


def test_replay_endpoint_renders_local_and_vllm_runs(app_url, embedded_verifier):
    from gradio_client import Client

    from specui.store import Store
    from tests.support.replay_helpers import per_step_request, store_vllm_style_run

    url, data = app_url
    client = Client(url, verbose=False)
    decoded = client.predict(PROMPT, "ngram", "embedded", 4, 16, 0.0, 0, True, api_name="/decode")
    status, stats, out, steps, *_ = client.predict(decoded["run_id"], 0, 100, api_name="/replay")
    assert status.startswith("done: replayed") and "SpecUI engine trace" in status
    assert _text_of(out) == embedded_verifier.tokenizer.decode(
        decoded["output_token_ids"], skip_special_tokens=False
    )
    assert f"**{decoded['acceptance_length']:.2f}**" in stats
    # (whether the adaptive policy drafted at all follows this machine's measured costs)
    assert ('class="tok accepted"' in steps) == (decoded["acceptance_length"] > 1)

    output = embedded_verifier.encode(
        "The quick brown fox jumps over the lazy dog again and again.", chat=False
    )[:12]
    texts = _embedded_texts()
    run_id, _ = store_vllm_style_run(
        Store(data / "specui.db"),
        [("vllm prompt", per_step_request(0, [1, 2], output, [2, 0, 3], 3))],
        k=3,
        texts=texts,
    )
    status, stats, out, steps, *_ = client.predict(f"#{run_id}", "0", 100, api_name="/replay")
    assert "vLLM per-step counts" in status and "not the rejected draft tokens" in status
    accepted = [html.unescape(t) for t in re.findall(r'class="tok accepted"[^>]*>([^<]*)<', steps)]
    # Newest step first: step 3 accepted output[5:8], step 1 output[1:3].
    assert accepted == [texts(t).replace(" ", "␣") for t in output[5:8] + output[1:3]]
    assert steps.count('class="tok rejected unknown"') == 2 and "3 drafted, 2 accepted" in steps
    assert f"**{1 + 5 / 3:.2f}**" in stats and "request 0" in stats
    status, *_ = client.predict(run_id, 7, 100, api_name="/replay")
    assert "has no request 7" in status


def _open_replay(page) -> None:
    """Open the Playground's replay accordion (an earlier test may have opened it)."""
    refresh = page.locator("#replay-refresh")
    if not refresh.is_visible():
        page.locator("#replay").get_by_text("Replay a stored run").click()
    refresh.wait_for(state="visible", timeout=15_000)


def test_browser_replay_a_stored_vllm_histogram_run(page, app_url):
    from specui.store import Store
    from tests.support.replay_helpers import histogram_request, store_vllm_style_run

    output = list(range(1000, 1012))  # token texts are not needed here: ids show as <id>
    run_id, _ = store_vllm_style_run(
        Store(app_url[1] / "specui.db"),
        [("hist prompt", histogram_request(0, [1, 2], output, [1, 1, 0, 2]))],
        k=3,
        texts=_embedded_texts(),
    )
    _tab(page, "Playground")
    _open_replay(page)
    page.locator("#replay-refresh").click()
    page.wait_for_function(
        f"() => document.querySelector('#replay-run input')?.value.startsWith('#{run_id} ')"
    )
    page.wait_for_function(
        "() => document.querySelector('#replay-request input')?.value.startsWith('0:')"
    )
    page.locator("#replay-rate input[type=number]").fill("50")
    page.locator("#replay-rate input[type=number]").press("Enter")
    page.locator("#replay-go").click()
    _wait_for_text(page, "#status", f"steps of run {run_id}")
    assert "NOT the real per-step order" in page.locator("#status").inner_text()
    # histogram: one step accepted 1, two accepted 3
    assert page.locator("#steps-a .tok.accepted").count() == 1 + 3 * 2
    # the steps that accepted 0 and 1 of 3
    assert page.locator("#steps-a .tok.rejected.unknown").count() == 2
    page.screenshot(path=str(SHOTS / "replay.png"), full_page=True)


def test_browser_stop_ends_a_replay(page, app_url):
    from specui.store import Store
    from specui.vllm.client import RequestResult
    from tests.support.replay_helpers import store_vllm_style_run

    # No acceptance data ("tokens"): 300 one-token steps at 1 step/s, so Stop comes mid-replay
    # (even at the slider's previous 50 steps/s the replay would last 6 s).
    res = RequestResult(0, [1, 2], output_token_ids=list(range(2000, 2300)), finish_reason="length")
    run_id, _ = store_vllm_style_run(
        Store(app_url[1] / "specui.db"), [("tokens prompt", res)], k=3, texts=_embedded_texts()
    )
    _tab(page, "Playground")
    _open_replay(page)
    page.locator("#replay-refresh").click()
    page.wait_for_function(
        f"() => document.querySelector('#replay-run input')?.value.startsWith('#{run_id} ')"
    )
    page.locator("#replay-rate input[type=number]").fill("1")
    page.locator("#replay-rate input[type=number]").press("Enter")
    page.locator("#replay-go").click()
    _wait_for_text(page, "#status", f"replaying run {run_id},")
    assert "each output token is shown as its own step" in page.locator("#status").inner_text()
    page.locator("#stop").click()
    _wait_for_text(page, "#status", f"steps of run {run_id}")
    stopped = re.search(
        r"replay stopped at step (\d+) of 300", page.locator("#stats-a").inner_text()
    )
    assert stopped is not None and 0 < int(stopped.group(1)) < 300


def test_browser_doctor_ranks_a_truncated_checkpoint_first(page, app_url):
    """The Speculators tab's Doctor panel runs specui.doctor on a folder in the app's data
    folder: a checkpoint whose weights were cut short gets that finding first."""
    from specui.algorithms.resolve import shipped_drafters

    broken = app_url[1] / "doctor-broken"
    shutil.copytree(shipped_drafters()["eagle3"], broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    _tab(page, "Speculators")
    page.get_by_text("Doctor: why is acceptance low?").click()
    page.locator("#doctor-folder textarea").fill(str(broken))
    page.locator("#doctor-prompts textarea").fill("spec-bench:qa")
    page.locator("#doctor-run").click()
    first = page.locator("#doctor-report li").first
    first.wait_for(timeout=180_000)
    assert first.get_attribute("data-code") == "weights_unreadable", page.locator(
        "#doctor-report"
    ).inner_text()
    assert first.get_attribute("data-severity") == "error"
    assert "truncated" in first.inner_text()
    assert (
        broken / "doctor.json"
    ).is_file()  # stored with the speculator: it lies in the app's data folder
    page.locator("#doctor").screenshot(path=str(SHOTS / "doctor.png"))
