"""Serving a speculator with vLLM: the exact ``vllm serve`` line for a folder."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from specui.trace import SpecUIError
from specui.verifier import EMBEDDED, EMBEDDED_HUB_ID


def speculative_config(folder: str | Path, num_speculative_tokens: int | None = None) -> dict:
    """vLLM's ``--speculative-config`` for a speculators-format folder.

    P-EAGLE is served as ``eagle3`` with ``parallel_drafting`` (vLLM rejects
    ``"method": "peagle"``, and without the flag it would silently run the
    sequential EAGLE-3 path and skip ``mask_hidden``)."""
    folder = Path(folder)
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise SpecUIError(f"{folder}: cannot read config.json ({e})") from None
    model_type = cfg.get("speculators_model_type")
    methods = {"dflash": "dflash", "dspark": "dspark", "eagle3": "eagle3", "peagle": "eagle3"}
    if model_type not in methods:
        raise SpecUIError(f"{folder}: vLLM serves no speculators_model_type {model_type!r}")
    if num_speculative_tokens is None:
        proposals = cfg.get("speculators_config", {}).get("proposal_methods") or [{}]
        num_speculative_tokens = proposals[0].get("speculative_tokens")
    out: dict = {"model": str(folder.resolve()), "method": methods[model_type]}
    if num_speculative_tokens:
        out["num_speculative_tokens"] = int(num_speculative_tokens)
    if model_type == "peagle":
        out["parallel_drafting"] = True
    return out


def vllm_serve_command(folder: str | Path, verifier: str, num_speculative_tokens: int | None = None) -> str:
    """The shell line that serves ``verifier`` with this speculator."""
    model = EMBEDDED_HUB_ID if verifier == EMBEDDED else verifier
    cfg = json.dumps(speculative_config(folder, num_speculative_tokens), separators=(", ", ": "))
    return f"vllm serve {shlex.quote(model)} --speculative-config {shlex.quote(cfg)}"
