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

A stored vLLM step knows less than a local one: vLLM does not report the
rejected draft tokens nor any probabilities, so those slots hold id -1, text
``?`` and probability NaN; the accepted drafts are the emitted tokens.  The
first step of every request is the prefill (one token, no drafts), as it is
in vLLM.  Draft and verify times per step are not reported by vLLM (0 here);
the request's wall time is.
"""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from specui.acceptance import (
    acceptance_length,
    draft_acceptance_rate,
    per_position_acceptance,
)
from specui.algorithms.ngram import NgramConfig
from specui.algorithms.spec import algorithm_for_vllm
from specui.data import Prompt, load_prompts
from specui.errors import SpecUIError
from specui.metrics.comparison import Comparison, compare
from specui.store import Backend, Run, RunRecorder, Store, collect_versions
from specui.trace import (
    FinalTokenKind,
    GenerationResult,
    SamplingParams,
    StepTrace,
    check_decode_settings,
)
from specui.vllm.server import (
    ServerConfig,
    VLLMServer,
    redact_url,
    speculator_algorithm,
)

if TYPE_CHECKING:
    from specui.service import DecodeRequest

UNKNOWN_TOKEN = -1  # a drafted token vLLM does not report (rejected slots)
UNKNOWN_TEXT = "?"
APIS = ("completions", "chat")

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class BenchSettings:
    """How the prompts are sent.  Greedy by default (its output must equal the
    plain server's, whatever the speculator)."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int = 0
    concurrency: int = 1
    api: str = "completions"
    ignore_eos: bool = False
    request_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise SpecUIError(f"unknown API {self.api!r}; use completions or chat")
        if not 1 <= self.concurrency <= 1024:
            raise SpecUIError(f"concurrency must be in 1..1024, got {self.concurrency}")
        if self.max_new_tokens < 1:
            raise SpecUIError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise SpecUIError("temperature must be >= 0, top_p in (0, 1] and top_k >= 0")
        check_decode_settings(seed=self.seed)  # the range a stored run's seed has (DecodeRequest)

    def request(self, drafter: str) -> DecodeRequest:
        """What a run of these settings asks the server to decode (``specui.service``)."""
        from specui.service import DecodeRequest

        sampling = SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        # vLLM sends every draft each step (its adaptive verification, where on, is a setting of
        # the server): the run is stored as the fixed policy's.
        return DecodeRequest(
            drafter=drafter,
            sampling=sampling,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed,
            policy="fixed",
        )


@dataclass
class RequestResult:
    """One prompt's streamed generation as the client saw it."""

    index: int
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    finish_reason: str | None = None
    sent_at: float = 0.0  # time.monotonic()
    first_token_at: float | None = None
    last_token_at: float | None = None
    spec: dict[str, Any] | None = None  # metrics.speculative_decoding of the response

    @property
    def wall_time_s(self) -> float:
        return (self.last_token_at or self.sent_at) - self.sent_at

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.sent_at

    @property
    def itl_s(self) -> float | None:
        n = len(self.output_token_ids)
        if n < 2 or self.first_token_at is None or self.last_token_at is None:
            return None
        return (self.last_token_at - self.first_token_at) / (n - 1)


# --- Prometheus counters ----------------------------------------------------------------

SPEC_COUNTERS = {  # sample name -> SpecCounters field
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


@dataclass
class SpecCounters:
    """A snapshot (or a difference) of vLLM's speculative-decoding counters,
    summed over engines and models."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: dict[int, float] = field(default_factory=dict)  # 0-based position -> accepted
    present: bool = False  # the server exports them (it serves a speculator)

    @classmethod
    def parse(cls, text: str) -> SpecCounters:
        """The counters in a Prometheus text exposition (vLLM's ``/metrics``), read with
        prometheus_client's parser: label values may hold escaped quotes, and values
        exponents, NaN or +Inf, which a line regex gets wrong."""
        out = cls()
        try:
            samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
        except ValueError as e:  # the parser's error for text that is not the format
            raise SpecUIError(f"the server's /metrics is not Prometheus text: {e}") from None
        for sample in samples:
            if sample.name == PER_POS and sample.labels.get("position", "").isdigit():
                k = int(sample.labels["position"])
                out.per_position[k] = out.per_position.get(k, 0.0) + sample.value
            elif sample.name in SPEC_COUNTERS:
                out.present = True
                attr = SPEC_COUNTERS[sample.name]
                setattr(out, attr, getattr(out, attr) + sample.value)
        return out

    def __sub__(self, before: SpecCounters) -> SpecCounters:
        keys = set(self.per_position) | set(before.per_position)
        return SpecCounters(
            drafts=self.drafts - before.drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted=self.accepted - before.accepted,
            per_position={
                k: self.per_position.get(k, 0.0) - before.per_position.get(k, 0.0)
                for k in sorted(keys)
            },
            present=self.present or before.present,
        )

    @property
    def acceptance_length(self) -> float | None:
        """tau (``specui.acceptance``); None without drafts, as the counters do
        not count the steps that drafted nothing."""
        return acceptance_length(self.accepted, self.drafts, steps=None)

    @property
    def per_position_acceptance(self) -> list[float]:
        """a_k, k = 1..K (``specui.acceptance``); [] without drafts."""
        return per_position_acceptance(
            [self.per_position[k] for k in sorted(self.per_position)], self.drafts
        )

    def summary(self) -> dict[str, Any]:
        return {
            "drafts": int(self.drafts),
            "draft_tokens": int(self.draft_tokens),
            "accepted_tokens": int(self.accepted),
            "accepted_per_position": [int(self.per_position[k]) for k in sorted(self.per_position)],
            "acceptance_length": self.acceptance_length,
            "per_position_acceptance": self.per_position_acceptance,
            "draft_acceptance_rate": draft_acceptance_rate(self.accepted, self.draft_tokens),
        }


def read_counters(server: VLLMServer, client: httpx.Client | None = None) -> SpecCounters:
    try:
        if client is not None:
            r = client.get("/metrics")
        else:
            with server.client(30.0) as c:
                r = c.get("/metrics")
    except httpx.HTTPError as e:
        raise _server_error(server, "reading /metrics", e) from None
    if r.status_code != 200:
        return SpecCounters()  # metrics disabled on that server: per-request data only
    return SpecCounters.parse(r.text)


# --- talking to the server -----------------------------------------------------------------


def _server_error(server: VLLMServer, doing: str, exc: BaseException) -> SpecUIError:
    """One message for every way a server can go away mid-run."""
    msg = (
        f"the vLLM server at {redact_url(server.base_url)} failed while {doing}:"
        f" {type(exc).__name__}: {exc}"
    )
    if server.owned:
        # A server killed under us takes its watchdog a moment to report.
        deadline = time.monotonic() + 3.0
        while server.state != "exited" and time.monotonic() < deadline:
            time.sleep(0.1)
        if server.state == "exited":
            return SpecUIError(
                f"{msg}\nThe server process has exited (code {server.returncode}); last log"
                f" lines:\n{server.log_tail(15)}"
            )
    return SpecUIError(msg)


def tokenize_prompt(client: httpx.Client, model: str, prompt: Prompt) -> list[int]:
    """The prompt's token ids as the server tokenizes it (chat template applied)."""
    if prompt.token_ids is not None:
        return list(prompt.token_ids)
    messages = (
        list(prompt.messages)
        if prompt.messages is not None
        else [{"role": "user", "content": prompt.text}]
    )
    r = client.post(
        "/tokenize", json={"model": model, "messages": messages, "add_generation_prompt": True}
    )
    if r.status_code != 200:
        raise SpecUIError(
            f"the server could not tokenize prompt {prompt.id} ({r.status_code}): {_error_text(r)}"
        )
    return [int(t) for t in r.json()["tokens"]]


def _error_text(r: httpx.Response) -> str:
    try:
        body = r.json()
        err = body.get("error", body) if isinstance(body, dict) else body
        return str(err.get("message", err) if isinstance(err, dict) else err)[:500]
    except ValueError:
        return r.text[:500]


def _request_body(
    model: str, prompt: Prompt, ids: list[int], s: BenchSettings, index: int
) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": s.max_new_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "stream": True,
        # The last chunk then carries usage and metrics.speculative_decoding.
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "ignore_eos": s.ignore_eos,
    }
    if s.top_k > 0:
        body["top_k"] = s.top_k
    if s.temperature > 0:
        body["seed"] = s.seed + index  # one stream per prompt, as the local benchmark does
    if s.api == "chat":
        if prompt.token_ids is not None:
            raise SpecUIError(
                f"prompt {prompt.id} is token ids; the chat API needs text (use --api completions)"
            )
        body["messages"] = (
            list(prompt.messages)
            if prompt.messages is not None
            else [{"role": "user", "content": prompt.text}]
        )
        return "/v1/chat/completions", body
    body["prompt"] = ids
    return "/v1/completions", body


def stream_request(
    client: httpx.Client,
    path: str,
    body: dict[str, Any],
    result: RequestResult,
    should_stop: Callable[[], bool] | None = None,
) -> RequestResult:
    """Send one streamed request and fill ``result`` from its server-sent events."""
    result.sent_at = time.monotonic()
    with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            r.read()
            raise SpecUIError(
                f"the server refused prompt {result.index} ({r.status_code}): {_error_text(r)}"
            )
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                err = chunk["error"]
                raise SpecUIError(
                    f"the server failed on prompt {result.index}: "
                    f"{err.get('message', err) if isinstance(err, dict) else err}"
                )
            spec = (chunk.get("metrics") or {}).get("speculative_decoding")
            if spec:
                result.spec = spec
            for choice in chunk.get("choices") or []:
                tokens = choice.get("token_ids") or []
                text = choice.get("text")
                if text is None:
                    text = (choice.get("delta") or {}).get("content") or ""
                if tokens:
                    now = time.monotonic()
                    if result.first_token_at is None:
                        result.first_token_at = now
                    result.last_token_at = now
                    result.output_token_ids.extend(int(t) for t in tokens)
                result.output_text += text
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
            if should_stop is not None and should_stop():
                result.finish_reason = "abort"
                break  # closing the stream makes vLLM abort the request
    return result


# --- turning a request into stored steps ----------------------------------------------------


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


def _stop_reason(res: RequestResult, eos_ids: set[int]) -> str:
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


# --- a run ---------------------------------------------------------------------------------


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


def _dist_ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None}
    ms = sorted(1000.0 * v for v in values)
    return {
        "mean": statistics.fmean(ms),
        "p50": ms[len(ms) // 2],
        "p90": ms[min(len(ms) - 1, int(0.9 * len(ms)))],
    }


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


def _eos_ids(model: str | None) -> set[int]:
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
        algorithm = _algorithm_of(spec_cfg)
        drafter = _drafter_name(spec_cfg)
    else:
        algorithm = speculator_algorithm(speculator)
        drafter = "none" if algorithm == "none" else Path(str(speculator)).name
    k = int(spec_cfg.get("num_speculative_tokens") or 0) if spec_cfg else 0
    source_model = server.plan.model if server.plan else model
    texts = TokenTexts(source_model)
    eos = _eos_ids(source_model)

    with server.client(
        settings.request_timeout_s, limits=httpx.Limits(max_connections=settings.concurrency + 4)
    ) as client:
        try:
            ids = [tokenize_prompt(client, model, p) for p in prompts]
            version = _server_version(client)
            before = read_counters(server, client)
        except httpx.HTTPError as e:
            raise _server_error(server, "preparing the benchmark", e) from None
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
            **_ngram_settings(spec_cfg),
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
            after = _settled_counters(server, client, before, results)
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
    _store_measurements(store, run.id, vllm_info, outcome)
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
                    path, body = _request_body(model, prompts[i], ids[i], settings, i)
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
                        raise _server_error(
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
                            stop_reason=_stop_reason(res, eos),
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


def _settled_counters(
    server: VLLMServer, client: httpx.Client, before: SpecCounters, results: list[RequestResult]
) -> SpecCounters:
    """Counters after the run.  vLLM records a step's stats just after streaming
    its tokens, so the last steps may land a moment after the last response:
    wait (briefly) until the counters cover every step the responses reported."""
    expected = sum(int((r.spec or {}).get("num_spec_steps") or 0) for r in results)
    deadline = time.monotonic() + 5.0
    last = None
    while True:
        try:
            now = read_counters(server, client)
        except SpecUIError:
            return before  # the server went away after the last response
        if not now.present:
            return now
        got = now.drafts - before.drafts
        if (expected and got >= expected) or (
            not expected and last is not None and now.drafts == last.drafts
        ):
            return now
        if time.monotonic() > deadline:
            return now
        last = now
        time.sleep(0.2)


def _server_version(client: httpx.Client) -> str:
    try:
        r = client.get("/version")
        return str(r.json().get("version")) if r.status_code == 200 else "unknown"
    except (httpx.HTTPError, ValueError, AttributeError):
        return "unknown"


def _algorithm_of(spec_cfg: dict[str, Any] | None) -> str:
    if not spec_cfg:
        return "none"
    return algorithm_for_vllm(spec_cfg) or str(
        spec_cfg.get("method")
    )  # ngram, or a method no spec claims


def _drafter_name(spec_cfg: dict[str, Any] | None) -> str:
    if not spec_cfg:
        return "none"
    model = spec_cfg.get("model")
    return Path(model).name if model else str(spec_cfg.get("method"))


def _store_measurements(
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


def _ngram_settings(spec_cfg: dict[str, Any] | None) -> dict[str, int]:
    """An n-gram server's lookup sizes under SpecUI's names, stored where a local n-gram
    run stores them, so the two backends' runs show the same settings."""
    if not spec_cfg or spec_cfg.get("method") != "ngram":
        return {}
    return NgramConfig.from_options(spec_cfg).settings()


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
