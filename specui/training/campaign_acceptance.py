"""Issue 49's acceptance, read from the campaign's ship check (``campaign_eval.ship_check``).

Each chosen drafter (``candidates/campaign-<stage>``) against the shipped drafter it would
replace, on the ship check's three benches:

    ship-spec-bench           Spec-Bench 48 at a fixed K: tau, a_1, the paired tau difference
                              (what ships: its interval above 0), the long-context groups, and
                              DSpark's confidence AUROC
    ship-math                 36 held-out gsm-symbolic prompts: no drafter loses more than 0.1 tau
    ship-spec-bench-adaptive  the speedup as users run it: each parallel drafter's >= EAGLE-3's

``scripts/train_shipped_tools.py campaign-acceptance STATE`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specui.training.campaign_eval import EVALS, bench_rows, group_taus, read_bench

# Issue 49's bars.
BAR_TAU = 2.0  # the best learned drafter, Spec-Bench 48, T=0
BAR_A1 = 0.45  # its first-draft acceptance
BAR_LONG_TAU = 1.8  # every learned drafter, on each of these groups
LONG_GROUPS = ("summarization", "rag")
BAR_MATH_DROP = 0.1  # the most held-out math tau may fall
BAR_AUROC = 0.75  # DSpark's confidence head, on Spec-Bench slots
PARALLEL = ("dflash", "dspark", "peagle")  # each at least EAGLE-3's speedup
CANDIDATE = "campaign-{}"  # the ship check's folder (and so drafter) name of a stage's choice


@dataclass(frozen=True)
class Verdict:
    """One chosen drafter against the one it would replace."""

    stage: str
    tau: float
    a1: float
    shipped_tau: float | None
    paired: tuple[float, float, float] | None  # tau difference and its 95% interval
    groups: dict[str, float] = field(default_factory=dict)
    math_tau: float | None = None
    shipped_math_tau: float | None = None
    speedup: float | None = None  # adaptive, over plain decoding in the same run
    auroc: float | None = None  # DSpark's confidence head

    @property
    def ships(self) -> bool:
        """Paired-better on Spec-Bench 48: the interval of the difference lies above 0."""
        return self.paired is not None and self.paired[1] > 0

    def problems(self, eagle3_speedup: float | None) -> list[str]:
        """The bars this drafter misses (the tau and a_1 bars are the best drafter's: see
        ``best_problems``)."""
        out = []
        if not self.ships:
            out.append("not paired-better than the shipped drafter on Spec-Bench 48")
        for g in LONG_GROUPS:
            t = self.groups.get(g)
            if t is None or t < BAR_LONG_TAU:
                out.append(f"{g} tau {'missing' if t is None else f'{t:.2f}'} < {BAR_LONG_TAU}")
        if self.math_tau is None or self.shipped_math_tau is None:
            out.append("no held-out math bench")
        elif self.math_tau < self.shipped_math_tau - BAR_MATH_DROP:
            out.append(
                f"math tau {self.math_tau:.2f}, down {self.shipped_math_tau - self.math_tau:.2f}"
                f" from {self.shipped_math_tau:.2f} (bar {BAR_MATH_DROP})"
            )
        if (
            self.stage in PARALLEL
            and eagle3_speedup is not None
            and (self.speedup is None or self.speedup < eagle3_speedup)
        ):
            got = "missing" if self.speedup is None else f"{self.speedup:.2f}x"
            out.append(f"speedup {got} < EAGLE-3's {eagle3_speedup:.2f}x")
        if self.stage == "dspark" and (self.auroc is None or self.auroc < BAR_AUROC):
            got = "missing" if self.auroc is None else f"{self.auroc:.3f}"
            out.append(f"confidence AUROC {got} < {BAR_AUROC}")
        return out


def verdicts(folder: Path, stages: tuple[str, ...] = ("dflash", "dspark", "peagle", "eagle3")):
    """A Verdict for each stage the ship check benched (stages it did not are left out)."""
    from specui.metrics.calibration import tau_difference_interval
    from specui.metrics.comparison import prompt_drafts
    from specui.store import Store

    evals = folder / EVALS
    fixed, math, adaptive = (
        read_bench(evals / f"{n}.json")
        for n in ("ship-spec-bench", "ship-math", "ship-spec-bench-adaptive")
    )
    rows = {n: bench_rows(b) for n, b in (("fixed", fixed), ("math", math), ("adaptive", adaptive))}
    store = Store(evals / "bench.db") if (evals / "bench.db").is_file() else None
    out = []
    for stage in stages:
        name = CANDIDATE.format(stage)
        new, old = rows["fixed"].get(name), rows["fixed"].get(stage)
        if new is None:
            continue
        paired = None
        if store is not None and old is not None:
            a, b = prompt_drafts(store, new["run_id"]), prompt_drafts(store, old["run_id"])
            both = sorted(set(a) & set(b))
            paired = tau_difference_interval([a[i] for i in both], [b[i] for i in both])
        m_new, m_old = rows["math"].get(name), rows["math"].get(stage)
        fast = rows["adaptive"].get(name)
        out.append(
            Verdict(
                stage=stage,
                tau=_tau(new),
                a1=float(new.get("acceptance_pos_1") or 0.0),
                shipped_tau=_tau(old) if old else None,
                paired=paired,
                groups=group_taus(fixed, name),
                math_tau=_tau(m_new) if m_new else None,
                shipped_math_tau=_tau(m_old) if m_old else None,
                speedup=float(fast["speedup"]) if fast and fast.get("speedup") else None,
                auroc=new.get("confidence_auroc"),
            )
        )
    return out


def best_problems(found: list[Verdict]) -> list[str]:
    """The tau bar: the best learned drafter (by tau) reaches BAR_TAU and BAR_A1."""
    if not found:
        return ["no drafter benched by the ship check yet"]
    best = max(found, key=lambda v: v.tau)
    out = []
    if best.tau < BAR_TAU:
        out.append(f"best tau {best.tau:.2f} ({best.stage}) < {BAR_TAU}")
    if best.a1 < BAR_A1:
        out.append(f"its a_1 {best.a1:.2f} < {BAR_A1}")
    return out


def _tau(row: dict) -> float:
    return float(row.get("acceptance_length") or 1.0)
