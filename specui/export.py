"""Serving a speculator with vLLM: the exact ``vllm serve`` line for a folder."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from specui.algorithms.spec import ALGORITHMS
from specui.errors import SpecUIError
from specui.verifier.embedded import EMBEDDED, EMBEDDED_HUB_ID


def speculative_config(folder: str | Path, num_speculative_tokens: int | None = None) -> dict:
    """vLLM's ``--speculative-config`` for a speculators-format folder.

    The method and any extra keys are the algorithm's (``AlgorithmSpec.vllm_method``,
    ``vllm_extra``: P-EAGLE is served as ``eagle3`` with ``parallel_drafting``)."""
    folder = Path(folder)
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise SpecUIError(f"{folder}: cannot read config.json ({e})") from None
    model_type = cfg.get("speculators_model_type")
    spec = ALGORITHMS.get(model_type) if isinstance(model_type, str) else None
    if spec is None or spec.vllm_method is None:
        raise SpecUIError(f"{folder}: vLLM serves no speculators_model_type {model_type!r}")
    if num_speculative_tokens is None:
        proposals = cfg.get("speculators_config", {}).get("proposal_methods") or [{}]
        num_speculative_tokens = proposals[0].get("speculative_tokens")
    out: dict = {"model": str(folder.resolve()), "method": spec.vllm_method}
    if num_speculative_tokens:
        out["num_speculative_tokens"] = int(num_speculative_tokens)
    out.update(spec.vllm_extra)
    return out


def vllm_serve_command(
    folder: str | Path, verifier: str, num_speculative_tokens: int | None = None
) -> str:
    """The shell line that serves ``verifier`` with this speculator."""
    model = EMBEDDED_HUB_ID if verifier == EMBEDDED else verifier
    cfg = json.dumps(speculative_config(folder, num_speculative_tokens), separators=(", ", ": "))
    return f"vllm serve {shlex.quote(model)} --speculative-config {shlex.quote(cfg)}"
