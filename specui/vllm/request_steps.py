"""A streamed vLLM request as stored steps, with the text of each token.

A stored vLLM step knows less than a local one: vLLM does not report the rejected draft
tokens nor any probabilities, so those slots hold id -1, text ``?`` and probability NaN; the
accepted drafts are the emitted tokens.  The first step of every request is the prefill (one
token, no drafts), as it is in vLLM.  Draft and verify times per step are not reported by vLLM
(0 here); the request's wall time is.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from specui.trace import FinalTokenKind, StepTrace
from specui.vllm.client import RequestResult

UNKNOWN_TOKEN = -1  # a drafted token vLLM does not report (rejected slots)
UNKNOWN_TEXT = "?"


class TokenTexts:
    """Token id -> text, from the verifier's tokenizer where it is on this machine."""

    def __init__(self, model: str | None) -> None:
        self._tok = None
        self._cache: dict[int, str] = {}
        if model and Path(model).is_dir():
            try:
                from transformers import AutoTokenizer

                self._tok = AutoTokenizer.from_pretrained(model)
            except Exception:  # noqa: BLE001 - texts are cosmetic; ids are what counts
                self._tok = None

    def __call__(self, token_id: int) -> str:
        if token_id < 0:
            return UNKNOWN_TEXT
        text = self._cache.get(token_id)
        if text is None:
            text = (
                self._tok.decode([token_id], skip_special_tokens=False)
                if self._tok is not None
                else f"<{token_id}>"
            )
            self._cache[token_id] = text
        return text


def _step(
    step: int, context_len: int, accepted: int, drafted: int, emitted: list[int], text: TokenTexts
) -> StepTrace:
    nan = math.nan
    drafts = emitted[: min(accepted, len(emitted))]
    drafts = drafts + [UNKNOWN_TOKEN] * (drafted - len(drafts))
    final = emitted[accepted] if accepted < len(emitted) else UNKNOWN_TOKEN
    return StepTrace(
        step=step,
        context_len=context_len,
        draft_token_ids=drafts,
        draft_texts=[text(t) for t in drafts],
        draft_probs=[nan] * drafted,
        target_probs=[nan] * drafted,
        confidences=None,
        num_accepted=accepted,
        final_token_id=final,
        final_token_text=text(final),
        final_token_kind=FinalTokenKind.BONUS if accepted >= drafted else FinalTokenKind.CORRECTED,
        emitted_token_ids=list(emitted),
        draft_time_s=0.0,
        verify_time_s=0.0,
    )


def steps_from_request(res: RequestResult, text: TokenTexts) -> tuple[list[StepTrace], str]:
    """The request's steps and where they came from: ``per_step`` (vLLM's ordered
    per-step counts), ``histogram`` (synthesised from the per-request histogram),
    or ``tokens`` (no acceptance data: one token per step, as without a speculator)."""
    out = res.output_token_ids
    ctx = len(res.prompt_token_ids)
    spec = res.spec or {}
    accepted = spec.get("per_step_accepted")
    drafted = spec.get("per_step_drafted")
    source = "per_step"
    if not accepted or not drafted or len(accepted) != len(drafted):
        hist = spec.get("acceptance_histogram")
        if hist and spec.get("num_spec_steps"):
            k = int(spec.get("num_spec_tokens") or len(hist) - 1)
            accepted = [j for j, count in enumerate(hist) for _ in range(int(count))]
            drafted = [k] * len(accepted)
            source = "histogram"
        else:
            accepted, drafted, source = [], [], "tokens"
    steps: list[StepTrace] = []
    pos = 0
    # The prefill emits the first token without drafts (vLLM drafts from its hidden states).
    plan = [(0, 0)] + list(zip(accepted, drafted, strict=True))
    for acc, n_draft in plan:
        if pos >= len(out):
            break
        emitted = out[pos : pos + acc + 1]
        steps.append(_step(len(steps), ctx + pos, int(acc), int(n_draft), emitted, text))
        pos += len(emitted)
    # Tokens beyond the reported steps came from steps that drafted nothing
    # (vLLM skips drafting near the length limit): one token each.
    while pos < len(out):
        steps.append(_step(len(steps), ctx + pos, 0, 0, out[pos : pos + 1], text))
        pos += 1
    return steps, source


def stop_reason(res: RequestResult, eos_ids: set[int]) -> str:
    if res.finish_reason == "length":
        return "max_tokens"
    if res.finish_reason == "abort":
        return "cancelled"
    if res.finish_reason == "stop":
        return (
            "eos"
            if res.output_token_ids and (not eos_ids or res.output_token_ids[-1] in eos_ids)
            else "stop_string"
        )
    return res.finish_reason or "unknown"


def eos_ids(model: str | None) -> set[int]:
    if not model:
        return set()
    try:
        cfg = json.loads((Path(model) / "generation_config.json").read_text())
    except (OSError, ValueError):
        try:
            cfg = json.loads((Path(model) / "config.json").read_text())
        except (OSError, ValueError):
            return set()
    eos = cfg.get("eos_token_id")
    return {eos} if isinstance(eos, int) else set(eos or [])
