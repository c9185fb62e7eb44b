"""Benchmarking a vLLM server over HTTP and storing the run like a local one.

Each prompt is one streamed request to ``/v1/completions`` (prompt token ids
from the server's own ``/tokenize``, so the server decides the chat template)
or ``/v1/chat/completions``, ``concurrency`` at a time.  What is measured:

* per request: output tokens and text, wall time (send -> last token), time to
  first token, inter-token latency ((last - first token time) / (tokens - 1));
* per request, where the server reports it (``--per-request-spec-decode-metrics
  detailed``, which SpecUI's launcher always passes): the accepted and drafted
  count of every verify step, in order.  These become the run's stored steps,
  so ``specui.metrics.comparison`` gives tau and a_k exactly as for a local run.
  With ``summary`` only a per-request histogram exists: the steps are then
  synthesised from it (right counts, unknown order);
* per run: vLLM's Prometheus counters (``vllm:spec_decode_*``) read before and
  after and subtracted -- tau and a_k over everything the server did in that
  window (exact when nothing else uses the server).

The requests are sent by ``client.py``, their steps rebuilt by ``request_steps.py``, the
counters read by ``counters.py`` and the run's extra settings written by ``stored_run.py``.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from specui.data import Prompt, load_prompts
from specui.errors import SpecUIError
from specui.metrics.comparison import Comparison, compare
from specui.store import Backend, RunRecorder, Store, collect_versions
from specui.trace import GenerationResult
from specui.vllm.client import (
    BenchSettings,
    RequestResult,
    request_body,
    server_error,
    server_version,
    stream_request,
    tokenize_prompt,
)
from specui.vllm.counters import read_counters, settled_counters
from specui.vllm.launch_plan import ServerConfig, speculator_algorithm
from specui.vllm.request_steps import TokenTexts, eos_ids, steps_from_request, stop_reason
from specui.vllm.server import VLLMServer, redact_url
from specui.vllm.stored_run import (
    VLLMRun,
    ngram_settings,
    served_algorithm,
    served_drafter_name,
    served_weights_fingerprint,
    store_measurements,
    verifier_label,
)

Progress = Callable[[int, int], None]


def _dist_ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None}
    ms = sorted(1000.0 * v for v in values)
    return {
        "mean": statistics.fmean(ms),
        "p50": ms[len(ms) // 2],
        "p90": ms[min(len(ms) - 1, int(0.9 * len(ms)))],
    }


def run_benchmark(
    store: Store,
    server: VLLMServer,
    prompts: Sequence[Prompt],
    *,
    prompt_set: str,
    verifier: str | None = None,
    speculator: str | None = None,
    settings: BenchSettings = BenchSettings(),
    label: str | None = None,
    owner: str | None = None,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> VLLMRun:
    """Send every prompt to ``server`` and store the run (backend ``vllm``).

    ``speculator`` says what the server speculates with (none | ngram | a
    folder): a launched server knows it from its plan; for an attached server
    it only labels the run.  A server that dies mid-run ends the run as
    failed, with the prompts that finished kept."""
    if not prompts:
        raise SpecUIError("no prompts to send")
    server.check_alive()
    model = server.model or server.served_model()
    spec_cfg = server.plan.speculative_config if server.plan else None
    if server.plan is not None:
        algorithm = served_algorithm(spec_cfg)
        drafter = served_drafter_name(spec_cfg)
    else:
        algorithm = speculator_algorithm(speculator)
        drafter = "none" if algorithm == "none" else Path(str(speculator)).name
    k = int(spec_cfg.get("num_speculative_tokens") or 0) if spec_cfg else 0
    source_model = server.plan.model if server.plan else model
    texts = TokenTexts(source_model)
    eos = eos_ids(source_model)

    with server.client(
        settings.request_timeout_s, limits=httpx.Limits(max_connections=settings.concurrency + 4)
    ) as client:
        try:
            ids = [tokenize_prompt(client, model, p) for p in prompts]
            version = server_version(client)
            before = read_counters(server, client)
        except httpx.HTTPError as e:
            raise server_error(server, "preparing the benchmark", e) from None
        if server.plan is None and before.present:
            # An attached server that speculates: K from its per-position counters.
            k = len(before.per_position)
            if algorithm == "none":
                algorithm, drafter = "unknown", "attached-speculator"
        vllm_info: dict[str, Any] = {
            "server": "launched" if server.owned else "attached",
            "base_url": redact_url(server.base_url),
            "model": model,
            "speculative_config": spec_cfg,
            "command_line": server.command_line,
            "api": settings.api,
            "concurrency": settings.concurrency,
            "ignore_eos": settings.ignore_eos,
        }
        # The stored settings as the run service writes a local run's (torch: only when storing).
        from specui.service import run_settings

        request = settings.request(drafter)
        # concurrency at the top level too: a baseline should match it (metrics.find_baseline)
        extra = {
            "vllm": vllm_info,
            "concurrency": settings.concurrency,
            **ngram_settings(spec_cfg),
        }
        run = store.create_run(
            verifier=verifier_label(verifier, model),
            verifier_fingerprint=served_weights_fingerprint(source_model),
            prompt_set=prompt_set,
            algorithm=algorithm,
            drafter=drafter,
            backend=Backend.VLLM,
            label=label,
            owner=owner,
            seed=request.seed,
            versions={**collect_versions(), "vllm_server": version},
            settings=run_settings(request, k, extra),
        )
        assert run.id is not None
        results: list[RequestResult] = []
        sources: set[str] = set()
        t0 = time.monotonic()
        with RunRecorder(store, run.id) as rec:
            done = _send_all(
                client,
                server,
                model,
                prompts,
                ids,
                settings,
                should_stop,
                progress,
                rec,
                texts,
                eos,
                k,
                results,
                sources,
            )
            if done < len(prompts):
                rec.stop()
            elapsed = time.monotonic() - t0
            after = settled_counters(server, client, before, results)
            rec.flush()
    diff = after - before if after.present else None
    tokens = sum(len(r.output_token_ids) for r in results)
    outcome = VLLMRun(
        run_id=run.id,
        num_prompts=len(results),
        num_output_tokens=tokens,
        elapsed_s=elapsed,
        aggregate_tokens_per_s=tokens / elapsed if elapsed > 0 else 0.0,
        ttft_ms=_dist_ms([r.ttft_s for r in results if r.ttft_s is not None]),
        itl_ms=_dist_ms([r.itl_s for r in results if r.itl_s is not None]),
        counters=diff.summary() if diff is not None else None,
        step_source="+".join(sorted(sources)) or "none",
        results=results,
    )
    store_measurements(store, run.id, vllm_info, outcome)
    return outcome


def _send_all(
    client: httpx.Client,
    server: VLLMServer,
    model: str,
    prompts: Sequence[Prompt],
    ids: list[list[int]],
    settings: BenchSettings,
    should_stop: Callable[[], bool] | None,
    progress: Progress | None,
    rec: RunRecorder,
    texts: TokenTexts,
    eos: set[int],
    k: int,
    results: list[RequestResult],
    sources: set[str],
) -> int:
    """Keep ``concurrency`` requests in flight; record each as it finishes (in
    this thread: RunRecorder is not thread-safe).  Returns the prompts finished."""
    pending: dict[Future[RequestResult], int] = {}
    next_index = 0
    done = 0
    stop_flag = threading.Event()

    def stopping() -> bool:
        if should_stop is not None and should_stop():
            stop_flag.set()
        return stop_flag.is_set()

    with ThreadPoolExecutor(
        max_workers=settings.concurrency, thread_name_prefix="specui-vllm-bench"
    ) as pool:
        try:
            while next_index < len(prompts) or pending:
                while (
                    next_index < len(prompts)
                    and len(pending) < settings.concurrency
                    and not stopping()
                ):
                    i = next_index
                    path, body = request_body(model, prompts[i], ids[i], settings, i)
                    fut = pool.submit(
                        stream_request, client, path, body, RequestResult(i, ids[i]), stopping
                    )
                    pending[fut] = i
                    next_index += 1
                if not pending:
                    break
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    i = pending.pop(fut)
                    try:
                        res = fut.result()
                    except httpx.HTTPError as e:
                        raise server_error(
                            server,
                            f"generating prompt {i} ({done} of {len(prompts)} prompts finished)",
                            e,
                        ) from None
                    if res.finish_reason == "abort":
                        continue  # stopped by the user: not a finished prompt
                    if not res.prompt_token_ids and res.output_token_ids:
                        res.prompt_token_ids = ids[i]
                    steps, source = steps_from_request(res, texts)
                    sources.add(source if k else "plain")
                    rec.add_result(
                        i,
                        prompts[i].preview(10_000),
                        GenerationResult(
                            prompt_token_ids=res.prompt_token_ids,
                            output_token_ids=res.output_token_ids,
                            output_text=res.output_text,
                            steps=steps,
                            stop_reason=stop_reason(res, eos),
                            wall_time_s=res.wall_time_s,
                            num_speculative_tokens=k,
                        ),
                    )
                    results.append(res)
                    done += 1
                    if progress is not None:
                        progress(done, len(prompts))
        except BaseException:
            stop_flag.set()  # in-flight requests end at their next chunk
            for fut in pending:
                fut.cancel()
            raise
    return done


# --- the whole benchmark: baseline + speculators ----------------------------------------------


def bench(
    store: Store,
    *,
    speculators: Sequence[str],
    prompts: str,
    limit: int | None = None,
    verifier: str | None = None,
    settings: BenchSettings = BenchSettings(),
    num_speculative_tokens: int | None = None,
    baseline: bool = True,
    base_url: str | None = None,
    api_key: str | None = None,
    server_config: ServerConfig | None = None,
    owner: str | None = None,
    log: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_server: Callable[[VLLMServer | None], None] | None = None,
) -> tuple[list[VLLMRun], Comparison]:
    """Benchmark each speculator (and, first, the plain verifier) on the same prompts.

    Without ``base_url`` each one gets a server of its own, launched and
    stopped here (``server_config`` holds the other launch options).  With
    ``base_url`` the one attached server is measured, ``speculators[0]``
    naming what it serves."""
    prompt_list = load_prompts(prompts, split="eval", limit=limit)
    if not prompt_list:
        raise SpecUIError(f"prompt set {prompts!r} has no prompts")
    say = log or (lambda _m: None)
    runs: list[VLLMRun] = []
    if base_url:
        if len(speculators) > 1:
            raise SpecUIError(
                "an attached server serves one configuration: give at most one --speculator"
            )
        speculator = speculators[0] if speculators else "none"
        server = VLLMServer.attach(base_url, api_key=api_key)
        say(f"attached to {redact_url(server.base_url)} ({server.model})")
        runs.append(
            run_benchmark(
                store,
                server,
                prompt_list,
                prompt_set=prompts,
                verifier=verifier,
                speculator=speculator,
                settings=settings,
                owner=owner,
                should_stop=should_stop,
                progress=lambda d, n: say(f"{d}/{n} prompts"),
            )
        )
        return runs, compare(store, [r.run_id for r in runs])
    names = (["none"] if baseline else []) + [s for s in speculators if s not in ("none", "plain")]
    if not names:
        raise SpecUIError("nothing to benchmark: name a --speculator or keep the baseline")
    verifier = verifier or "embedded"
    base = server_config or ServerConfig(verifier=verifier)
    for name in names:
        if should_stop is not None and should_stop():
            break
        plain = name == "none"
        cfg = replace(
            base,
            verifier=verifier,
            speculator=None if plain else name,
            num_speculative_tokens=None if plain else num_speculative_tokens,
            speculative_config=None if plain else base.speculative_config,
        )
        t0 = time.monotonic()
        say(f"{name}: starting vLLM")
        server = VLLMServer.launch(cfg, wait=False)
        if on_server is not None:
            on_server(server)
        try:
            say(f"{name}: {server.command_line}")
            server.wait_ready(cfg.startup_timeout_s)
            say(f"{name}: server ready after {server.ready_after_s:.0f} s")
            run = run_benchmark(
                store,
                server,
                prompt_list,
                prompt_set=prompts,
                verifier=verifier,
                settings=settings,
                owner=owner,
                should_stop=should_stop,
                progress=lambda d, n, nm=name: say(f"{nm}: {d}/{n} prompts"),
            )
            runs.append(run)
            say(
                f"{name}: run {run.run_id}, {run.num_output_tokens} tokens in {run.elapsed_s:.1f} s"
                f" ({run.aggregate_tokens_per_s:.1f} tok/s), {time.monotonic() - t0:.0f} s with"
                " start-up"
            )
        finally:
            server.stop()
            if on_server is not None:
                on_server(None)
    return runs, compare(store, [r.run_id for r in runs])
