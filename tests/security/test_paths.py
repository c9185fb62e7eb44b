"""Paths a user types stay inside the app's data folders."""

from __future__ import annotations

import pytest

from specui.errors import SpecUIError
from specui.paths import confine


def test_confine_accepts_paths_inside_and_refuses_escapes(tmp_path, monkeypatch):
    root = tmp_path / "data"
    (root / "speculators" / "mine").mkdir(parents=True)
    outside = tmp_path / "secret"
    outside.mkdir()
    (root / "speculators" / "link-out").symlink_to(outside)
    monkeypatch.setenv("SPECUI_EXTRA_ROOTS", "")
    roots = [root]
    assert confine("speculators/mine", roots) == (root / "speculators" / "mine").resolve()
    assert (
        confine(str(root / "speculators" / "mine"), roots)
        == (root / "speculators" / "mine").resolve()
    )
    for bad in (
        "../secret",
        str(outside),
        "speculators/link-out",
        "speculators/../../secret",
        "/etc/passwd",
    ):
        with pytest.raises(SpecUIError, match="outside"):
            confine(bad, roots)


def test_operator_may_add_roots(tmp_path, monkeypatch):
    extra = tmp_path / "models"
    extra.mkdir()
    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(SpecUIError):
        confine(str(extra))
    monkeypatch.setenv("SPECUI_EXTRA_ROOTS", str(extra))
    assert confine(str(extra)) == extra.resolve()
