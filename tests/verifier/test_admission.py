"""Memory admitted before a load (``specui.verifier.admission``): the size read from the
weights' headers is the size loaded, and a load that does not fit, or is over the operator's
cap, is refused with a message that says what would fit -- before any weight is read."""

from __future__ import annotations

import shutil
import threading

import pytest
import torch
from safetensors.torch import load_file

from specui.errors import SpecUIError
from specui.verifier import admission
from specui.verifier.admission import MARGIN_ENV, MAX_MODEL_ENV, Weights
from specui.verifier.embedded import embedded_gguf_path

GB = 10**9


def test_the_headers_count_every_element_the_folder_stores(fixture_dir) -> None:
    for name in ("verifier", "dflash", "dspark"):
        tensors = load_file(fixture_dir / name / "model.safetensors")
        weights = admission.folder_weights(fixture_dir / name)
        assert weights.elements == sum(t.numel() for t in tensors.values())
        assert weights.stored_bytes == sum(t.numel() * t.element_size() for t in tensors.values())
        assert weights.resident_bytes == 4 * weights.elements  # computed in float32


def test_the_loaded_verifier_holds_what_the_headers_said(fixture_dir, fixture_verifier) -> None:
    weights = admission.folder_weights(fixture_dir / "verifier")
    held = {p.data_ptr(): p.numel() for p in fixture_verifier.model.parameters()}
    assert sum(held.values()) == weights.elements


def test_a_gguf_file_is_sized_from_its_tensor_infos() -> None:
    weights = admission.gguf_weights(embedded_gguf_path())
    assert 134e6 < weights.elements < 136e6  # SmolLM2-135M
    assert weights.stored_bytes == embedded_gguf_path().stat().st_size


def test_a_verifier_over_the_operators_cap_is_refused_before_it_loads(
    fixture_dir, tmp_path, monkeypatch
) -> None:
    from specui.verifier.model import Verifier

    folder = tmp_path / "verifier"
    shutil.copytree(fixture_dir / "verifier", folder)
    monkeypatch.setenv(MAX_MODEL_ENV, "0.001")  # 1 MB; the fixture holds 1.3 MB in float32
    with pytest.raises(SpecUIError) as info:
        Verifier.load(str(folder))
    message = str(info.value)
    assert "over this app's cap of 1 MB" in message and "--max-model-gb" in message
    assert str(tmp_path) not in message  # names the model, not the server's folders
    monkeypatch.setenv(MAX_MODEL_ENV, "0.01")
    assert Verifier.load(str(folder)).num_layers == 6


def test_a_drafter_that_does_not_fit_is_refused_with_what_would_fit(
    fixture_verifier, fixture_dir, monkeypatch
) -> None:
    from specui.algorithms.resolve import resolve_drafter

    # A margin of all the free memory and more: nothing fits.
    monkeypatch.setenv(MARGIN_ENV, str(admission.free_bytes() // 2**20 + 1024))
    with pytest.raises(SpecUIError) as info:
        resolve_drafter(str(fixture_dir / "dflash"), fixture_verifier)
    message = str(info.value)
    assert message.startswith("not enough memory to load speculator dflash")
    assert "would fit" in message
    monkeypatch.delenv(MARGIN_ENV)
    assert resolve_drafter(str(fixture_dir / "dflash"), fixture_verifier).name == "dflash"


def test_loads_started_together_do_not_count_on_the_same_memory(monkeypatch) -> None:
    # Room for one 4 GB load, not two: the first holds its reservation until it ends.
    big = Weights(elements=GB // 2, stored_bytes=2 * GB)  # peaks at 4 GB
    room = 6 * GB
    margin = (admission.free_bytes() - room) // 2**20
    if margin < 0:
        pytest.skip("this machine has less than 6 GB free")
    monkeypatch.setenv(MARGIN_ENV, str(margin))
    inside, release = threading.Event(), threading.Event()

    def first() -> None:
        with admission.admitted("model a", big):
            inside.set()
            release.wait(60)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert inside.wait(60)
        with (
            pytest.raises(SpecUIError, match="not enough memory to load model b"),
            admission.admitted("model b", big),
        ):
            pass
    finally:
        release.set()
        thread.join()
    with admission.admitted("model b", big):  # the first has ended: its memory is free again
        pass


def test_a_refused_load_reserves_nothing(monkeypatch) -> None:
    monkeypatch.setenv(MAX_MODEL_ENV, "0.000001")
    before = admission.room_bytes()
    with (
        pytest.raises(SpecUIError, match="over this app's cap"),
        admission.admitted("model", Weights(10**6, 4 * 10**6)),
    ):
        pass
    assert admission._pending() == 0
    assert admission.room_bytes() > before - GB  # nothing held back (free memory moves a bit)


def test_sizes_read_as_a_visitor_reads_them() -> None:
    assert admission.size_text(140e9) == "140.0 GB"
    assert admission.size_text(1.3e6) == "1 MB"
    assert torch.float32.itemsize == 4  # what resident_bytes counts per element
