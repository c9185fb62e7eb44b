"""The vLLM benchmark's HTTP client: how prompts are sent (``BenchSettings``), the server's
``/tokenize`` and ``/version``, and one streamed request read into a ``RequestResult``
(tokens, text, the times of its first and last token and vLLM's per-request
speculative-decoding metrics)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from specui.data import Prompt
from specui.errors import SpecUIError
from specui.trace import SamplingParams, check_decode_settings
from specui.vllm.server import VLLMServer, redact_url

if TYPE_CHECKING:
    from specui.service import DecodeRequest

APIS = ("completions", "chat")


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


def server_error(server: VLLMServer, doing: str, exc: BaseException) -> SpecUIError:
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


def request_body(
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


def server_version(client: httpx.Client) -> str:
    try:
        r = client.get("/version")
        return str(r.json().get("version")) if r.status_code == 200 else "unknown"
    except (httpx.HTTPError, ValueError, AttributeError):
        return "unknown"
