"""What a vLLM run stores beyond a local run's: its labels (the verifier and weights it is
compared under, the algorithm and drafter a server's speculative config serves, an n-gram
server's settings) and its measurements (latencies, throughput, counters) under
``vllm.measured`` in the run's settings."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specui.algorithms.ngram import NgramConfig
from specui.algorithms.spec import algorithm_for_vllm
from specui.store import Run, Store
from specui.vllm.client import RequestResult


@dataclass
class VLLMRun:
    """What ``run_benchmark`` measured (also stored in the run's settings under ``vllm``)."""

    run_id: int
    num_prompts: int
    num_output_tokens: int
    elapsed_s: float
    aggregate_tokens_per_s: float
    ttft_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    counters: dict[str, Any] | None
    step_source: str
    results: list[RequestResult] = field(repr=False, default_factory=list)


def verifier_label(verifier: str | None, model: str | None) -> str:
    """The verifier name a vLLM run stores: the same as a local run's for the
    embedded model and for folders, so the two line up in the store.  Without
    ``verifier`` (an attached server) it comes from the served model."""
    # torch is imported only when a run is stored
    from specui.verifier.embedded import EMBEDDED, EMBEDDED_NAME, cache_dir

    choice = verifier or model or "unknown"
    if choice == EMBEDDED:
        return EMBEDDED_NAME
    path = Path(choice).expanduser()
    if path.is_dir():
        if path.resolve() == (cache_dir() / "models" / "smollm2-135m-instruct").resolve():
            return EMBEDDED_NAME
        return path.resolve().name
    return choice


def served_weights_fingerprint(model: str | None) -> str | None:
    """The weights fingerprint a vLLM run stores: the served folder's, read from its
    safetensors (the same value a local Verifier of that folder has, so local and vLLM runs
    of one weight set line up), or None (unknown) when the model is not a local folder."""
    from specui.verifier.fingerprint import weights_fingerprint

    return weights_fingerprint(model)


def served_algorithm(spec_cfg: dict[str, Any] | None) -> str:
    if not spec_cfg:
        return "none"
    return algorithm_for_vllm(spec_cfg) or str(
        spec_cfg.get("method")
    )  # ngram, or a method no spec claims


def served_drafter_name(spec_cfg: dict[str, Any] | None) -> str:
    if not spec_cfg:
        return "none"
    model = spec_cfg.get("model")
    return Path(model).name if model else str(spec_cfg.get("method"))


def store_measurements(
    store: Store, run_id: int, vllm_info: dict[str, Any], outcome: VLLMRun
) -> None:
    """Add what only a vLLM run has (latencies, aggregate throughput, counters)
    to the run's settings, under ``vllm.measured``."""
    measured = {k: v for k, v in asdict(outcome).items() if k not in ("results", "run_id")}
    with store.write() as s:
        run = s.get(Run, run_id)
        if run is None:
            return
        settings = run.settings
        settings["vllm"] = {**vllm_info, "measured": measured}
        run.settings_json = json.dumps(_finite(settings), sort_keys=True, allow_nan=False)
        s.add(run)


def _finite(value: Any) -> Any:
    """NaN and infinities as null (the settings column holds strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def ngram_settings(spec_cfg: dict[str, Any] | None) -> dict[str, int]:
    """An n-gram server's lookup sizes under SpecUI's names, stored where a local n-gram
    run stores them, so the two backends' runs show the same settings."""
    if not spec_cfg or spec_cfg.get("method") != "ngram":
        return {}
    return NgramConfig.from_options(spec_cfg).settings()
