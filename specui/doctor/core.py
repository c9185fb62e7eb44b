"""``diagnose``: the one function the CLI and the Speculators tab call.

Static checks first; the dynamic ones only when no static error stands, since
measuring a drafter that cannot fit the verifier tells nothing the error does
not, and costs a minute.  The report's findings come ranked (``findings.ranked``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from specui.doctor import identity, static
from specui.doctor.dynamic import DynamicOptions, run_dynamic
from specui.doctor.facts import read_facts
from specui.doctor.findings import Finding, Report, Severity
from specui.errors import SpecUIError
from specui.verifier.embedded import EMBEDDED
from specui.verifier.model import Verifier

DEFAULT_PROMPTS = "spec-bench:qa"
TEXT_SAMPLE = 32  # prompts tokenized for the mask-token frequency (cheap: no decoding)


@dataclass(frozen=True)
class DoctorOptions:
    """What to measure on.  ``prompts``: a registered set or a JSONL file; None: the set the
    model card names, else ``spec-bench:qa``.  ``k``: the K to check (None: the config's)."""

    prompts: str | None = None
    num_prompts: int = 8
    max_new_tokens: int = 64
    k: int | None = None
    vllm: bool = False
    max_prompt_tokens: int = (
        1024  # longer prompts are skipped: their prefill dominates and proves nothing
    )
    dynamic: DynamicOptions = field(default_factory=DynamicOptions)

    def __post_init__(self) -> None:
        if self.num_prompts < 1 or self.max_new_tokens < 8:
            raise SpecUIError("the doctor needs at least 1 prompt and 8 new tokens")
        if self.k is not None and self.k < 1:
            raise SpecUIError(f"K must be >= 1, got {self.k}")


def speculator_folder(speculator: str | Path) -> Path:
    """A shipped drafter's name or a folder, as a resolved folder path."""
    from specui.algorithms.resolve import shipped_drafters

    shipped = shipped_drafters()
    path = shipped.get(str(speculator)) or Path(speculator).expanduser()
    if not path.is_dir():
        known = ", ".join(shipped) or "none"
        raise SpecUIError(
            f"speculator {str(speculator)!r} is neither a shipped drafter ({known}) nor a folder"
        )
    return path.resolve()


def verifier_folder(verifier_choice: str) -> Path | None:
    """The folder a verifier choice was loaded from, for content hashes (None: a hub id)."""
    if verifier_choice == EMBEDDED:
        from specui.verifier.embedded import embedded_folder

        return embedded_folder()
    path = Path(verifier_choice).expanduser()
    return path if path.is_dir() else None


def diagnose(
    speculator: str | Path,
    verifier: Verifier,
    verifier_choice: str = EMBEDDED,
    options: DoctorOptions | None = None,
) -> Report:
    """Examine the speculator at ``speculator`` for ``verifier``: ranked findings and
    measurements."""
    opts = options or DoctorOptions()
    t0 = time.perf_counter()
    folder = speculator_folder(speculator)
    measured: dict[str, Any] = {}
    facts, findings = read_facts(folder)
    prompt_set = opts.prompts or _card_prompts(folder) or DEFAULT_PROMPTS
    prompts, encoded, note = _prompts(
        verifier, prompt_set, max(opts.num_prompts, TEXT_SAMPLE), opts.max_prompt_tokens
    )
    if note:
        findings.append(note)
    if facts.config is not None and facts.weights_ok:
        findings += identity.check_algorithm(facts)
        findings += identity.check_verifier(facts, verifier, verifier_folder(verifier_choice))
        findings += static.check_aux_layers(facts, verifier)
        findings += static.check_vocab_map(facts, verifier)
        findings += static.check_mask_token(facts, verifier, encoded)
        findings += static.check_block(facts, opts.k)
        findings += static.check_dtype_rope(facts, verifier)
        findings += static.check_serving(facts)
    measured["static_s"] = round(time.perf_counter() - t0, 2)
    blocking = [f for f in findings if f.severity is Severity.ERROR]
    if blocking:
        findings.append(
            Finding(
                "dynamic_skipped",
                Severity.INFO,
                "dynamic checks skipped",
                evidence=f"fix the {len(blocking)} error(s) first: a drafter that does not fit the "
                "verifier measures nothing useful",
            )
        )
    elif not encoded:
        findings.append(
            Finding("dynamic_skipped", Severity.INFO, "dynamic checks skipped: no prompts")
        )
    else:
        findings += _dynamic(
            folder,
            verifier,
            verifier_choice,
            prompts[: opts.num_prompts],
            encoded[: opts.num_prompts],
            prompt_set,
            opts,
            measured,
        )
    return Report(
        speculator=str(folder),
        verifier=verifier_choice,
        prompts=prompt_set,
        findings=findings,
        measurements=measured,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        wall_time_s=round(time.perf_counter() - t0, 2),
    )


def _dynamic(
    folder: Path,
    verifier: Verifier,
    verifier_choice: str,
    prompts: list,
    encoded: list[list[int]],
    prompt_set: str,
    opts: DoctorOptions,
    measured: dict[str, Any],
) -> list[Finding]:
    from specui.algorithms.resolve import resolve_drafter
    from specui.doctor.measure import greedy_samples

    t = time.perf_counter()
    try:
        drafter = resolve_drafter(str(folder), verifier, opts.k)
        samples = greedy_samples(verifier, encoded, opts.max_new_tokens)
        measured["samples_s"] = round(time.perf_counter() - t, 2)
        raw = [_raw(verifier, p) for p in prompts]
        n = opts.dynamic.decode_prompts
        out = run_dynamic(
            drafter, verifier, folder, samples, raw, encoded[:n], prompt_set, opts.dynamic, measured
        )
        if opts.vllm:
            from specui.doctor.served import served_findings

            out += served_findings(
                folder, verifier, verifier_choice, drafter, prompts, opts.max_new_tokens, measured
            )
    except (SpecUIError, RuntimeError, IndexError, ValueError) as e:
        return [
            Finding(
                "drafter_failed",
                Severity.ERROR,
                "the drafter fails when run",
                evidence=f"{type(e).__name__}: {e}",
                cause="a config or weights the static checks did not catch",
                fix="report it with this output",
            )
        ]
    measured["dynamic_s"] = round(time.perf_counter() - t, 2)
    return out


def _raw(verifier: Verifier, prompt: Any) -> list[int] | None:
    if prompt.text is None or verifier.tokenizer is None:
        return None
    return verifier.encode(prompt.text, chat=False)


def _card_prompts(folder: Path) -> str | None:
    from specui.data import prompt_sets
    from specui.doctor.dynamic import card_claim

    name = card_claim(folder)[1]
    return name if name in prompt_sets() else None


def _prompts(
    verifier: Verifier, name: str, limit: int, max_tokens: int
) -> tuple[list, list[list[int]], Finding | None]:
    """(prompts, their token ids) that fit, or a finding saying why there are none."""
    from specui.data import load_prompts, prompt_sets

    split = "eval" if name in prompt_sets() or "," in name else "all"
    try:
        loaded = load_prompts(name, split=split, limit=limit)
    except SpecUIError as e:
        return (
            [],
            [],
            Finding(
                "dynamic_skipped",
                Severity.WARNING,
                f"prompts {name!r} unavailable",
                evidence=str(e),
            ),
        )
    kept, ids = [], []
    for p in loaded:
        try:
            enc = p.encode(verifier)
        except SpecUIError as e:
            return (
                [],
                [],
                Finding(
                    "dynamic_skipped",
                    Severity.INFO,
                    "the prompts cannot be tokenized",
                    evidence=str(e),
                ),
            )
        if 1 < len(enc) <= max_tokens:
            kept.append(p)
            ids.append(enc)
    return kept, ids, None
