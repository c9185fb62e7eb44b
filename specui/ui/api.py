"""Named API endpoints for scripts (``gradio_client``): the same library calls
the tabs make, with plain JSON-friendly arguments."""

from __future__ import annotations

import gradio as gr

from specui.benchmark import bench
from specui.choices import ui_drafter, ui_verifier
from specui.data import Prompt, prompt_sets
from specui.data.prompts import check_prompt_text, encode_text
from specui.errors import SpecUIError
from specui.metrics.comparison import compare, comparison_csv_text
from specui.service import DECODE_EVENTS, DecodeRequest, record_run
from specui.store import Store
from specui.trace import SamplingParams, as_int
from specui.ui.refusals import refuse
from specui.workbench import WORKBENCH

# One API call decodes at most this much (the CLI's `specui bench` has no cap):
# a shared CPU should not be held for minutes by one request.
MAX_BENCH_PROMPTS = 8
MAX_BENCH_NEW_TOKENS = 256


def _ids(run_ids: str) -> list[int]:
    try:
        ids = [int(x) for x in str(run_ids).replace(",", " ").split()]
    except ValueError:
        raise SpecUIError(f"run ids must be integers, got {run_ids!r}") from None
    if not ids:
        raise SpecUIError("give at least one run id")
    return ids


def register(store: Store) -> None:
    def decode(
        prompt: str,
        drafter: str = "ngram",
        verifier: str = "embedded",
        num_speculative_tokens: int = 0,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        seed: int = 0,
        chat: bool = True,
        request: gr.Request = None,
    ) -> dict:
        """Decode one prompt, store it as a run; returns the summary and the run id.  Steps send
        drafts as the adaptive policy decides (the run service's default, stored with the run)."""
        try:
            check_prompt_text(prompt)
            verifier, drafter = (
                ui_verifier(verifier),
                ui_drafter(drafter),
            )  # paths: the app's folders only
            v = WORKBENCH.verifier(verifier)
            k = as_int(num_speculative_tokens, "number of speculative tokens (K)") or None
            wanted = DecodeRequest(
                drafter=drafter,
                num_speculative_tokens=k,
                sampling=SamplingParams(temperature=temperature),
                max_new_tokens=as_int(max_new_tokens, "max_new_tokens"),
                seed=as_int(seed, "seed"),
            )
            p = (
                Prompt(id="api", source="api", text=prompt)
                if chat
                else Prompt(
                    id="api", source="api", token_ids=tuple(encode_text(v, prompt, chat=False))
                )
            )
            with WORKBENCH.drafter(drafter, v, k) as d:
                recorded = record_run(
                    store,
                    v,
                    d,
                    [p],
                    prompt_set="api",
                    request=wanted,
                    owner=request.session_hash if request else None,
                )
            return {"run_id": recorded.run_id, **recorded.results[0].summary()}
        except SpecUIError as e:
            raise refuse("/decode", e) from None

    def bench_runs(
        drafter: str = "ngram",
        prompts: str = "demo",
        limit: int = 2,
        max_new_tokens: int = 64,
        verifier: str = "embedded",
        num_speculative_tokens: int = 0,
        temperature: float = 0.0,
        seed: int = 0,
        request: gr.Request = None,
    ) -> dict:
        """Plain decoding, then ``drafter``, on the first ``limit`` held-out prompts of a
        registered prompt set; both runs are stored.  Returns ``run_ids`` and ``runs``
        (one comparison row per run: tau, speedup against the plain run, a_k, ...)."""
        try:
            # Registered sets only: a path would let a visitor make the server read its files.
            if prompts not in prompt_sets():
                raise SpecUIError(
                    f"unknown prompt set {prompts!r}; one of: {', '.join(sorted(prompt_sets()))}"
                )
            n, new = as_int(limit, "limit"), as_int(max_new_tokens, "max_new_tokens")
            if not 1 <= n <= MAX_BENCH_PROMPTS:
                raise SpecUIError(f"limit must be in 1..{MAX_BENCH_PROMPTS} prompts, got {n}")
            if not 1 <= new <= MAX_BENCH_NEW_TOKENS:
                raise SpecUIError(f"max_new_tokens must be in 1..{MAX_BENCH_NEW_TOKENS}, got {new}")
            if not drafter or not str(drafter).strip():
                raise SpecUIError("name a drafter (none, ngram, a shipped name or a folder)")
            verifier, drafter = (
                ui_verifier(verifier),
                ui_drafter(drafter),
            )  # paths: the app's folders only
            result = bench(
                store,
                verifier=verifier,
                drafters=[drafter],
                prompts=prompts,
                limit=n,
                max_new_tokens=new,
                sampling=SamplingParams(temperature=temperature),
                num_speculative_tokens=as_int(
                    num_speculative_tokens, "number of speculative tokens (K)"
                )
                or None,
                seed=as_int(seed, "seed"),
                owner=request.session_hash if request else None,
            )
            return {"run_ids": result.run_ids, "runs": result.comparison.rows}
        except SpecUIError as e:
            raise refuse("/bench", e) from None

    def compare_runs(run_ids: str) -> list[dict]:
        """The comparison table of the given runs (one dict per run; keys are CSV columns)."""
        try:
            return compare(store, _ids(run_ids)).rows
        except SpecUIError as e:
            raise refuse("/compare", e) from None

    def export_csv(run_ids: str) -> str:
        """The comparison of the given runs as CSV text."""
        try:
            return comparison_csv_text(compare(store, _ids(run_ids)))
        except SpecUIError as e:
            raise refuse("/export", e) from None

    # Decoding's group: DECODE_EVENTS calls at once, of which DECODE_SLOTS decode (the others
    # load their models meanwhile, or wait for a slot: specui.service.decode_slot).
    gr.api(decode, api_name="decode", concurrency_id="decode", concurrency_limit=DECODE_EVENTS)
    # Shares decoding's group and slots: both hold the CPU for the whole decode.
    gr.api(bench_runs, api_name="bench", concurrency_id="decode", concurrency_limit=DECODE_EVENTS)
    gr.api(compare_runs, api_name="compare")
    gr.api(export_csv, api_name="export")
