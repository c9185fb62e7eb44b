"""vLLM's speculative-decoding counters (``vllm:spec_decode_*`` on ``/metrics``): read
before and after a run and subtracted, tau and a_k over everything the server did in that
window (exact when nothing else uses the server)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from specui.acceptance import (
    acceptance_length,
    draft_acceptance_rate,
    per_position_acceptance,
)
from specui.errors import SpecUIError
from specui.vllm.client import RequestResult, server_error
from specui.vllm.server import VLLMServer

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
        raise server_error(server, "reading /metrics", e) from None
    if r.status_code != 200:
        return SpecCounters()  # metrics disabled on that server: per-request data only
    return SpecCounters.parse(r.text)


def settled_counters(
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
