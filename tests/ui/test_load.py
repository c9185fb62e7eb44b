"""The short form of the load test (bench/load_test.py is the long one): a real
``python app.py`` with a queue of one, eight ``gradio_client`` sessions calling
``/decode`` at once, a fixed number of calls each.

Bounded by calls, not time, and no assertion on speed: only that the extra
requests are refused with a clear "queue is full", nothing else fails, every
answered call's run is stored and finished, and the app's memory stays bounded.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from specui.service import DECODE_EVENTS
from tests.support.load_driver import App, LoadResult, check_store, run_load
from tests.support.paths import REPO

# One more than the app admits at once (DECODE_EVENTS running, one queued) and one to spare.
SESSIONS = DECODE_EVENTS + 2
CALLS_PER_SESSION = 2
# Generous: the app with the embedded verifier sits near 1.1 GiB here; a leak
# per call or per session (20+ calls) would have to be large to pass this, but
# the point is a bound, not a tight budget.
RSS_CAP = 4 * 2**30


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    # A queue of one with DECODE_EVENTS requests at a time: of SESSIONS calls arriving
    # together at most DECODE_EVENTS + 1 are admitted, so refusals are certain, not a matter
    # of timing.
    data = tmp_path_factory.mktemp("loaddata")
    with App(data, queue_size=1) as app:
        res = run_load(
            app.url, app.proc.pid, SESSIONS, calls_per_session=CALLS_PER_SESSION, max_new_tokens=12
        )
        yield app, res


def test_no_errors_other_than_queue_full(loaded):
    app, res = loaded
    assert len(res.calls) == SESSIONS * CALLS_PER_SESSION
    assert not res.errors, [c.message for c in res.errors] + [app.log_tail()]
    assert res.ok, "no call was answered"
    full = [c for c in res.calls if c.outcome == "queue_full"]
    assert full, f"a queue of one never refused a call from {SESSIONS} sessions at once"
    assert all("queue is full" in c.message.lower() for c in full), {c.message for c in full}


def test_every_answered_call_is_stored_and_finished(loaded):
    app, res = loaded
    check = check_store(app.db, res)
    assert check.clean, check
    assert check.stored_done == len(res.ok)


def test_app_still_answers_and_memory_is_bounded(loaded):
    from gradio_client import Client

    app, res = loaded
    client = Client(app.url, verbose=False)
    out = client.predict("Say hello.", "ngram", "embedded", 4, 8, 0.0, 0, True, api_name="/decode")
    client.close()
    assert out["num_output_tokens"] >= 1
    assert app.proc.poll() is None
    assert 0 < res.rss_peak_bytes < RSS_CAP, f"peak RSS {res.rss_peak_bytes / 2**20:.0f} MiB"


def test_queue_size_must_be_positive():
    p = subprocess.run(
        [sys.executable, "app.py", "--queue-size", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    assert "--queue-size must be at least 1" in p.stderr


def test_growth_counts_only_samples_taken_while_the_sessions_call():
    # RSS 100 through the warm-up's window, 104 at the end of the load, then a drop after it
    # (the sessions ended): growth is 4%, the drop after the load does not count, and one
    # sample's spike inside a window does not move its median.
    samples = [(t / 2, 100 * 2**20) for t in range(0, 240)]  # 0-120 s
    samples += [(120 + t / 2, 104 * 2**20) for t in range(0, 120)]  # 120-180 s
    samples[150] = (75.0, 900 * 2**20)  # a transient inside the first window
    samples += [(180 + t / 2, 60 * 2**20) for t in range(0, 40)]  # after the load
    res = LoadResult([], 180.0, {}, 900 * 2**20, 100 * 2**20, 60 * 2**20, samples)
    assert res.rss_growth(warmup_s=60, window_s=60, duration_s=180) == pytest.approx(0.04)
    assert res.rss_median(180, 200) == 60 * 2**20
