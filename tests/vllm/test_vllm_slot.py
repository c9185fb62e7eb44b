"""The vLLM tab's one server slot, seen by two browser sessions at once.

The server belongs to the session that launched or attached it: the other sees it and
benchmarks on it, but cannot stop or replace it; an admin (``SPECUI_ADMIN=1``) can.
Both sessions go through the tab's own handlers (``specui.ui.vllm_tab``) with their
own ``gr.Request``.  The servers here are stand-ins that answer the attach handshake
(``/v1/models``, ``/health``) and hold every other request until released, so a
benchmark stays running for as long as the test needs; the same rules against a real
vLLM server:
``tests/vllm/test_vllm.py::test_two_sessions_share_a_real_server_only_its_owner_stops_it``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gradio as gr
import pytest

from specui.store import ADMIN_ENV, Store
from specui.ui import vllm_tab
from specui.vllm.session import VLLMSlot


class _StandIn(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.release = threading.Event()
        self.held = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _StandIn

    def _answer(self) -> None:
        if self.path == "/v1/models":
            body, code = json.dumps({"data": [{"id": "stand-in"}]}).encode(), 200
        elif self.path == "/health":
            body, code = b"", 200
        else:  # a benchmark's requests: held until the test lets them fail
            self.server.held += 1
            self.server.release.wait(60)
            body, code = b"released", 503
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def servers() -> Iterator[list[_StandIn]]:
    made = [_StandIn(), _StandIn()]
    for s in made:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield made
    for s in made:
        s.release.set()
        s.shutdown()
        s.server_close()


def _head(slot: VLLMSlot, request: gr.Request) -> str:
    return vllm_tab.status_markdown(slot, request)[0]


def test_only_the_session_that_attached_the_server_stops_or_replaces_it(
    servers, tmp_path, monkeypatch
) -> None:
    monkeypatch.delenv(ADMIN_ENV, raising=False)
    one, two = servers
    store = Store(tmp_path / "specui.db")
    slot = VLLMSlot()
    alice, bob = gr.Request(session_hash="alice"), gr.Request(session_hash="bob")

    vllm_tab.attach(slot, one.url, "", alice)
    assert "yours" in _head(slot, alice)
    assert "another visitor's" in _head(slot, bob) and one.url in _head(slot, bob)  # bob sees it
    assert "alice" not in json.dumps(slot.status("bob"))  # a session id is never shown to others

    # Bob can neither stop nor replace it, however he tries.
    for act in (
        lambda: vllm_tab.stop(slot, bob),
        lambda: vllm_tab.attach(slot, two.url, "", bob),
        lambda: vllm_tab.launch(slot, "embedded", "none", 0, bob),
        lambda: vllm_tab.compare(slot, store, "embedded", "ngram", 0, "demo", 1, 8, 1, 0.0, bob),
    ):
        with pytest.raises(gr.Error, match="belongs to another session"):
            act()
        assert slot.server.base_url == one.url and slot.owner == "alice"

    # Alice replaces her own server: the old one is detached, the new one is hers.
    old = slot.server
    vllm_tab.attach(slot, two.url, "", alice)
    assert slot.server.base_url == two.url and slot.owner == "alice" and str(old.state) == "stopped"

    # Bob benchmarks on Alice's server; the benchmark is his.
    vllm_tab.bench(slot, store, "embedded", "none", "demo", 1, 8, 1, 0.0, bob)
    job = slot.job
    deadline = time.monotonic() + 30
    while two.held == 0:  # its first request is at the server
        assert time.monotonic() < deadline and not job.done, job.error
        time.sleep(0.02)
    assert job.owner == "bob" and not job.done
    with pytest.raises(gr.Error, match="belongs to another session"):
        vllm_tab.stop_bench(slot, alice)
    assert not job.stop.is_set()
    # Nor is a running benchmark cut off by its server's owner replacing the server.
    with pytest.raises(gr.Error, match="benchmark is running"):
        vllm_tab.attach(slot, one.url, "", alice)
    vllm_tab.stop_bench(slot, bob)
    assert job.stop.is_set()
    two.release.set()
    deadline = time.monotonic() + 30
    while not job.done:
        assert time.monotonic() < deadline
        time.sleep(0.02)

    # An admin may stop anyone's server; then the slot is free for whoever comes.
    with pytest.raises(gr.Error, match="belongs to another session"):
        vllm_tab.stop(slot, bob)
    monkeypatch.setenv(ADMIN_ENV, "1")
    assert "admin mode" in _head(slot, bob)
    vllm_tab.stop(slot, bob)
    assert slot.server is None and "no vLLM server" in _head(slot, alice)
    monkeypatch.delenv(ADMIN_ENV)
    vllm_tab.attach(slot, one.url, "", bob)
    assert slot.owner == "bob" and "yours" in _head(slot, bob)
    with pytest.raises(gr.Error, match="belongs to another session"):
        vllm_tab.stop(slot, alice)
    vllm_tab.stop(slot, bob)
    assert slot.server is None
    store.close()
