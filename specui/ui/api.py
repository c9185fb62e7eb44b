"""Named API endpoints for scripts (``gradio_client``): the same library calls
the tabs make, with plain JSON-friendly arguments."""

from __future__ import annotations

import gradio as gr

from specui.benchmark import RunSpec, record_run
from specui.data import Prompt
from specui.metrics import compare, comparison_csv_text
from specui.store import Store
from specui.trace import SamplingParams, SpecUIError
from specui.workbench import WORKBENCH


def _ids(run_ids: str) -> list[int]:
    try:
        ids = [int(x) for x in str(run_ids).replace(",", " ").split()]
    except ValueError:
        raise gr.Error(f"run ids must be integers, got {run_ids!r}") from None
    if not ids:
        raise gr.Error("give at least one run id")
    return ids


def register(store: Store) -> None:
    def decode(prompt: str, drafter: str = "ngram", verifier: str = "embedded", num_speculative_tokens: int = 0,
               max_new_tokens: int = 64, temperature: float = 0.0, seed: int = 0, chat: bool = True,
               request: gr.Request = None) -> dict:
        """Decode one prompt, store it as a run; returns the summary and the run id."""
        try:
            if not prompt or not prompt.strip():
                raise SpecUIError("the prompt is empty")
            v = WORKBENCH.verifier(verifier)
            k = int(num_speculative_tokens) or None
            spec = RunSpec(drafter=drafter, num_speculative_tokens=k, sampling=SamplingParams(temperature=float(temperature)),
                           max_new_tokens=int(max_new_tokens), seed=int(seed))
            p = Prompt(id="api", source="api", text=prompt) if chat else Prompt(
                id="api", source="api", token_ids=tuple(v.encode(prompt)))
            with WORKBENCH.drafter(drafter, v, k) as d:
                recorded = record_run(store, v, d, [p], prompt_set="api", spec=spec,
                                      owner=request.session_hash if request else None)
            return {"run_id": recorded.run_id, **recorded.results[0].summary()}
        except SpecUIError as e:
            raise gr.Error(str(e)) from None

    def compare_runs(run_ids: str) -> list[dict]:
        """The comparison table of the given runs (one dict per run; keys are CSV columns)."""
        try:
            return compare(store, _ids(run_ids)).rows
        except SpecUIError as e:
            raise gr.Error(str(e)) from None

    def export_csv(run_ids: str) -> str:
        """The comparison of the given runs as CSV text."""
        try:
            return comparison_csv_text(compare(store, _ids(run_ids)))
        except SpecUIError as e:
            raise gr.Error(str(e)) from None

    gr.api(decode, api_name="decode", concurrency_id="decode", concurrency_limit=2)
    gr.api(compare_runs, api_name="compare")
    gr.api(export_csv, api_name="export")
