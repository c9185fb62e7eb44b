"""A public demo no visitor can exhaust (issue 50), against real ``python app.py`` processes
and a hub on loopback (``tests.support.hub_server``) that records every request.

- Started as ``make run`` starts it, the app refuses a hub id as verifier or speculator with
  a message naming the operator's switch, asks the hub nothing and writes nothing to its cache.
- Each hostile input leaves one log line (level, endpoint, message) and no traceback.
- With ``--allow-hub``, the tiny model loads and decodes, and the "140 GB" one is refused
  before any weight is requested.
- Loads waiting on a slow hub hold no decode slot: another visitor's decode finishes while two
  such loads are still pending (the slots are two; the bench measures the speed:
  ``bench/load_test.py --pending-load``).
"""

from __future__ import annotations

import os
import re
import time

import pytest

from specui.data.prompts import MAX_PROMPT_CHARS
from specui.errors import SpecUIError
from tests.support.hub_models import huge_repo, tiny_repo
from tests.support.hub_server import LoopbackHub
from tests.support.load_driver import App

GOOD = "Repeat: red green blue."
ONE_MB = "x" * max(2**20, MAX_PROMPT_CHARS + 1)
SLOW_S = 600.0  # a download that outlasts the test: the loads stay pending throughout


@pytest.fixture(scope="module")
def hub():
    repos = {
        "tiny/model": tiny_repo(),
        "huge/model": huge_repo(),
        "slow/one": tiny_repo(delay_s=SLOW_S),
        "slow/two": tiny_repo(delay_s=SLOW_S),
    }
    with LoopbackHub(repos) as server:
        yield server


def _env(hub: LoopbackHub, home) -> dict[str, str]:
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(home)}
    for key in ("HF_HUB_OFFLINE", "SPECUI_ALLOW_HUB", "SPECUI_MAX_MODEL_GB"):
        env.pop(key, None)
    return env


@pytest.fixture(scope="module")
def plain_app(hub, tmp_path_factory):
    """Started as ``make run`` starts it: no flags."""
    data = tmp_path_factory.mktemp("plain")
    home = tmp_path_factory.mktemp("hfhome")
    with App(data, queue_size=16, env=_env(hub, home)) as app:
        from gradio_client import Client

        yield Client(app.url, verbose=False), app, home


def _error(client, *args) -> str:
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as info:
        client.predict(*args, api_name="/decode")
    return str(info.value)


@pytest.mark.parametrize(
    ("verifier", "speculator", "kind"),
    [("meta-llama/Llama-3-70B", "ngram", "verifier"), ("embedded", "org/eagle3-70b", "speculator")],
)
def test_a_hub_id_is_refused_by_default_and_the_hub_never_asked(
    plain_app, hub, verifier, speculator, kind
):
    client, _, home = plain_app
    message = _error(client, GOOD, speculator, verifier, 0, 4, 0.0, 0, True)
    assert f"{kind} '" in message and "--allow-hub or SPECUI_ALLOW_HUB" in message
    assert hub.requests == []
    assert not [p for p in home.rglob("*") if p.is_file()]


# The hostile inputs: /decode takes (prompt, drafter, verifier, K, max_new_tokens,
# temperature, seed, chat).
HOSTILE = {
    "empty-prompt": ("", "ngram", "embedded", 0, 4, 0.0, 0, True),
    "1-mb-prompt": (ONE_MB, "ngram", "embedded", 0, 4, 0.0, 0, True),
    "dotdot-speculator": (GOOD, "../..", "embedded", 0, 4, 0.0, 0, True),
    "passwd-speculator": (GOOD, "/etc/passwd", "embedded", 0, 4, 0.0, 0, True),
    "root-verifier": (GOOD, "ngram", "/root", 0, 4, 0.0, 0, True),
    "negative-max-new": (GOOD, "ngram", "embedded", 0, -5, 0.0, 0, True),
    "huge-max-new": (GOOD, "ngram", "embedded", 0, 10**9, 0.0, 0, True),
    "negative-temperature": (GOOD, "ngram", "embedded", 0, 4, -1.0, 0, True),
    "k-10000": (GOOD, "ngram", "embedded", 10_000, 4, 0.0, 0, True),
    "seed-2-80": (GOOD, "ngram", "embedded", 0, 4, 0.0, 2**80, True),
    "nul-bytes": ("a\x00b", "ngram", "embedded", 0, 4, 0.0, 0, True),
    "hub-verifier": (GOOD, "ngram", "meta-llama/Llama-3-70B", 0, 4, 0.0, 0, True),
    "hub-speculator": (GOOD, "org/drafter", "embedded", 0, 4, 0.0, 0, True),
}
REFUSED = re.compile(r"^\S+ \S+ INFO specui\.ui: refused /decode: (.+)$", re.M)


def test_each_hostile_input_leaves_one_log_line_and_no_traceback(plain_app):
    client, app, _ = plain_app
    for case, args in HOSTILE.items():
        before = REFUSED.findall(app.log_tail(10**9))
        message = _error(client, *args)
        after = REFUSED.findall(app.log_tail(10**9))
        assert len(after) == len(before) + 1, (case, after[len(before) :])
        # The line holds what the visitor was told (flattened, capped at 500 characters).
        assert after[-1] == " ".join(message.split())[:500] or after[-1] in message, case
    assert "Traceback" not in app.log_tail(10**9)
    out = client.predict(GOOD, "ngram", "embedded", 4, 4, 0.0, 0, True, api_name="/decode")
    assert out["num_output_tokens"] == 4  # still serving


@pytest.fixture(scope="module")
def hub_app(hub, tmp_path_factory):
    data = tmp_path_factory.mktemp("hubapp")
    home = tmp_path_factory.mktemp("hfhome2")
    with App(data, queue_size=16, env=_env(hub, home), flags=("--allow-hub",)) as app:
        from gradio_client import Client

        yield Client(app.url, verbose=False), app


def test_with_allow_hub_the_tiny_model_decodes_and_the_huge_one_is_refused(hub_app, hub):
    client, app = hub_app
    out = client.predict(
        "red green blue", "ngram", "tiny/model", 2, 4, 0.0, 0, False, api_name="/decode"
    )
    assert out["num_output_tokens"] == 4
    assert hub.weight_requests("tiny/model")
    message = _error(client, GOOD, "ngram", "huge/model", 0, 4, 0.0, 0, False)
    assert message.startswith("not enough memory to load verifier huge/model"), message
    assert hub.weight_requests("huge/model") == []
    assert "Traceback" not in app.log_tail(10**9)


def test_pending_loads_hold_no_decode_slot(hub_app, hub):
    from gradio_client import Client

    client, app = hub_app
    # Two visitors whose verifiers download from a slow hub: as many as there are decode slots.
    waiting = []
    for repo in ("slow/one", "slow/two"):
        visitor = Client(app.url, verbose=False)
        args = ("red green blue", "ngram", repo, 2, 4, 0.0, 0, False)
        waiting.append(visitor.submit(*args, api_name="/decode"))
    for _ in range(1500):  # both downloads have started (the hub recorded their requests)
        if all(hub.weight_requests(r) for r in ("slow/one", "slow/two")):
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the slow downloads never started: {app.log_tail()}")
    # A third visitor decodes meanwhile, to the end.
    other = Client(app.url, verbose=False)
    job = other.submit(GOOD, "ngram", "embedded", 4, 8, 0.0, 0, True, api_name="/decode")
    assert job.result(timeout=300)["num_output_tokens"] == 8
    assert not any(w.done() for w in waiting)  # both loads are still pending


def test_the_allow_list_takes_ids_and_patterns(monkeypatch):
    from specui.choices import ui_drafter, ui_verifier

    monkeypatch.setenv("SPECUI_ALLOW_HUB", "tiny/*, org/one-model")
    assert ui_verifier("tiny/model") == "tiny/model"
    assert ui_drafter("org/one-model") == "org/one-model"
    with pytest.raises(SpecUIError, match="not among the hub models the operator allows"):
        ui_verifier("huge/model")
    monkeypatch.setenv("SPECUI_ALLOW_HUB", "0")
    with pytest.raises(SpecUIError, match="--allow-hub"):
        ui_verifier("tiny/model")


def test_a_waiting_visitor_is_told_what_the_load_does(monkeypatch):
    from specui.ui.playground import verifier_wait_note
    from specui.verifier import loading

    monkeypatch.setenv("SPECUI_ALLOW_HUB", "1")
    with loading.stage("some/model", "downloading 1.2 GB from the hub"):
        note = verifier_wait_note("some/model")
    assert note == "loading the verifier some/model: downloading 1.2 GB from the hub…"
    assert verifier_wait_note("some/model") == "loading some/model…"  # no stage said yet
