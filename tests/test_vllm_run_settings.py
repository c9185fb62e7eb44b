"""A vLLM bench run's stored settings come from the run service (``specui.service.run_settings``),
as a local run's do: no vLLM needed."""

from __future__ import annotations

import pytest

from specui.errors import SpecUIError
from specui.service import DecodeRequest, run_settings
from specui.store import DecodingSettings
from specui.vllm.client import BenchSettings


def test_bench_settings_ask_the_run_service_for_what_a_vllm_run_stores() -> None:
    sampling = {"temperature": 0.7, "top_p": 0.9, "top_k": 20}
    settings = BenchSettings(max_new_tokens=48, **sampling, seed=5, concurrency=3)
    request = settings.request("dflash")
    assert isinstance(request, DecodeRequest)
    assert (request.drafter, request.max_new_tokens, request.seed) == ("dflash", 48, 5)
    assert (request.sampling.temperature, request.sampling.top_p, request.sampling.top_k) == (
        0.7,
        0.9,
        20,
    )
    extra = {"vllm": {"api": "completions"}, "concurrency": 3}
    # What run_benchmark stored before it asked the run service: the same fields, the same values.
    by_hand = DecodingSettings(num_speculative_tokens=4, **sampling, max_new_tokens=48, extra=extra)
    assert run_settings(request, 4, extra) == by_hand
    assert run_settings(request, 4, extra).to_dict()["concurrency"] == 3  # top level, for baselines


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_a_seed_no_stored_run_can_hold_is_refused_before_any_request(seed: int) -> None:
    with pytest.raises(SpecUIError, match="seed"):
        BenchSettings(seed=seed)
