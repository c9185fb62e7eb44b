"""What the doctor reports: findings (severity, evidence, cause, fix) and the report.

A finding is either a *cause* (a setting or file that is wrong: the verifier,
the aux layers, the vocabulary map ...) or a *symptom* (low or collapsing
acceptance, a model card's tau not reached).  Symptoms are what a user sees;
causes are what to fix, so among findings of one severity every cause ranks
above every symptom, and causes rank by how much else they explain: a file that
cannot be read explains everything after it, a wrong verifier explains a wrong
vocabulary, and so on (``PRIORITY``).

Torch-free: the report is read back by the dashboard and the CLI's ``--json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Severity(StrEnum):
    ERROR = "error"  # the speculator cannot work as configured
    WARNING = "warning"  # it works, worse than it could, or a risk
    INFO = "info"  # a fact worth knowing (what vLLM needs, what was measured)


SEVERITY_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}

# Cause codes, most explanatory first; a code not listed ranks after these.
PRIORITY: tuple[str, ...] = (
    "weights_unreadable",  # nothing else can be trusted
    "config_unreadable",
    "algorithm_mismatch",  # the config names another model than the weights hold
    "verifier_mismatch",  # trained for another verifier: shapes, vocab, tokenizer follow
    "verifier_revision",
    "vocab_map",
    "aux_layers_range",
    "block_size",
    "mask_token",
    "aux_layers_shifted",
    "chat_template",
    "dtype",
    "rope",
    "vllm_plugin",  # vLLM-CPU without SpecUI's fixes: explains the two below
    "vllm_gap",
    "vllm_steps",  # the same rates, other drafts
    "speculators_version",
    "vllm_serving",
)

SYMPTOMS: tuple[str, ...] = (
    "drafter_failed",
    "acceptance_near_zero",
    "collapse",
    "engine_vs_teacher_forced",
    "card_tau",
    "acceptance",
    "dynamic_skipped",
)


@dataclass
class Finding:
    """One diagnosis: what was seen (evidence), why it likely happens (cause), what to do (fix)."""

    code: str  # a PRIORITY or SYMPTOMS entry: what kind of problem
    severity: Severity
    title: str  # one line
    evidence: str = ""
    cause: str = ""
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)  # the numbers behind the evidence

    @property
    def is_symptom(self) -> bool:
        return self.code in SYMPTOMS

    def rank_key(self) -> tuple[int, int, int]:
        order = (*PRIORITY, *SYMPTOMS)
        where = order.index(self.code) if self.code in order else len(order)
        return SEVERITY_ORDER[self.severity], int(self.is_symptom), where

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = str(self.severity)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        return cls(**{**d, "severity": Severity(d["severity"])})


def ranked(findings: list[Finding]) -> list[Finding]:
    """Findings by severity, causes before symptoms, then by ``PRIORITY`` (stable)."""
    return sorted(findings, key=Finding.rank_key)


@dataclass
class Report:
    """A doctor run: what was examined, the ranked findings and the measurements."""

    speculator: str  # the folder examined (resolved path)
    verifier: str
    prompts: str | None
    findings: list[Finding] = field(default_factory=list)
    measurements: dict[str, Any] = field(
        default_factory=dict
    )  # acceptance curves, counterfactuals, timings
    created_at: str = ""
    wall_time_s: float = 0.0
    version: int = 1

    def __post_init__(self) -> None:
        self.findings = ranked(self.findings)

    @property
    def first(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "findings": [f.to_dict() for f in self.findings]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        return cls(
            speculator=d["speculator"],
            verifier=d["verifier"],
            prompts=d.get("prompts"),
            findings=[Finding.from_dict(f) for f in d.get("findings", [])],
            measurements=d.get("measurements", {}),
            created_at=d.get("created_at", ""),
            wall_time_s=float(d.get("wall_time_s", 0.0)),
            version=int(d.get("version", 1)),
        )
