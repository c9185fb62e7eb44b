"""What the app keeps per visitor and per choice is bounded (bench/soak.py measures the
whole app over a long run; these pin down each bound).

- Gradio's state of a session idle past the limit is dropped (``specui.ui.memory``).
- The workbench keeps at most IDLE_PER_KEY drafters per configuration, IDLE_KEYS
  configurations and VERIFIERS_KEPT verifiers, least recently used dropped.
"""

from __future__ import annotations

import datetime

import pytest

from specui import workbench
from specui.workbench import Workbench


def test_the_state_of_idle_gradio_sessions_is_dropped(tmp_path, monkeypatch) -> None:
    from gradio.state_holder import StateHolder

    from specui.store import Store
    from specui.ui.app import build_app
    from specui.ui.memory import drop_idle

    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path))
    app = build_app(Store(tmp_path / "s.db"))
    assert drop_idle(app, 3600) == 0  # not launched: nothing held
    holder = StateHolder()
    holder.set_blocks(app)  # what launch() does
    for sid in ("gone", "here"):
        holder[sid]  # an event of that session: Gradio makes its SessionState
    now = datetime.datetime.now()
    holder.time_last_used["gone"] = now - datetime.timedelta(hours=2)
    assert drop_idle(app, 3600, now) == 1
    assert list(holder.session_data) == ["here"] and list(holder.time_last_used) == ["here"]
    assert holder["gone"] is not None  # a visitor who comes back gets a fresh one


def test_the_workbench_keeps_few_drafters_and_verifiers(fixture_dir, monkeypatch) -> None:
    bench = Workbench()
    verifier = bench.verifier(str(fixture_dir / "verifier"), "fp32")
    # Three runs at once with one configuration: two drafters are kept for the next ones.
    with (
        bench.drafter("ngram", verifier, 4),
        bench.drafter("ngram", verifier, 4),
        bench.drafter("ngram", verifier, 4),
    ):
        pass
    assert [len(p) for p in bench._idle.values()] == [workbench.IDLE_PER_KEY]
    for k in range(1, 30):  # a visitor trying every K
        with bench.drafter("ngram", verifier, k):
            pass
    assert len(bench._idle) == workbench.IDLE_KEYS
    assert [key[2] for key in bench._idle] == list(
        range(30 - workbench.IDLE_KEYS, 30)
    )  # the latest ones

    monkeypatch.setattr(workbench, "VERIFIERS_KEPT", 2)
    bench.verifier(str(fixture_dir / "verifier"), "bf16")
    assert bench.verifier(str(fixture_dir / "verifier"), "fp32") is verifier  # used last: kept
    bench.verifier(str(fixture_dir / "verifier"), "auto")
    assert [key[1] for key in bench._verifiers] == ["fp32", "auto"]
    with pytest.raises(KeyError):
        bench._verifiers[(str(fixture_dir / "verifier"), "bf16")]


def test_malloc_arenas_are_capped_unless_turned_off(monkeypatch) -> None:
    import ctypes.util

    from specui.ui.memory import ARENAS_ENV, limit_malloc_arenas, trim_malloc

    monkeypatch.setenv(ARENAS_ENV, "0")
    assert limit_malloc_arenas() is False
    monkeypatch.setenv(ARENAS_ENV, "2")
    glibc = ctypes.util.find_library("c") is not None and hasattr(
        ctypes.CDLL(ctypes.util.find_library("c")), "mallopt"
    )
    assert limit_malloc_arenas() is glibc
    trim_malloc()  # returns free heap memory; harmless anywhere


def test_the_idle_drafters_hold_at_most_the_pool_cap(
    fixture_dir, fixture_verifier, monkeypatch
) -> None:
    bench = Workbench()
    names = [str(fixture_dir / n) for n in ("dflash", "dspark", "eagle3", "peagle")]
    sizes = {}
    for name in names:
        with bench.drafter(name, fixture_verifier) as d:
            sizes[name] = workbench.held_bytes(d, fixture_verifier)
            shared = {t.data_ptr() for t in fixture_verifier.model.parameters()}
            mine = [t for t in d.model.parameters() if t.data_ptr() not in shared]
            # At least its own parameters (its kernels' copies come on top); never the
            # verifier's weights, which it only borrows.
            assert sizes[name] >= sum(t.numel() * t.element_size() for t in mine) > 0
            verifier_bytes = sum(t.numel() * 4 for t in fixture_verifier.model.parameters())
            assert sizes[name] < verifier_bytes + sum(t.numel() * 8 for t in mine)
    assert bench.idle_bytes() == sum(sizes.values())  # all four fit the default cap
    # A cap with room for the last two only: twenty visitors' twenty drafters stay bounded.
    cap = sizes[names[-1]] + sizes[names[-2]]
    monkeypatch.setenv(workbench.POOL_ENV, str(cap / 2**20))
    for name in names:
        with bench.drafter(name, fixture_verifier, 3):  # new configurations (K 3)
            pass
    assert bench.idle_bytes() <= cap
    assert [key[0] for key in bench._idle][-2:] == names[-2:]
    assert len(bench._idle) == 2
