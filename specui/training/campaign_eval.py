"""The campaign's evaluations: each drafter stage's snapshots, benched once the stage finishes.

    heldout     real tau on HELDOUT_PROMPTS prompts of the campaign's held-out split (long and
                short alternate): what picks the checkpoint a drafter ships from
    spec-bench  tau on SPEC_BENCH_PROMPTS Spec-Bench questions (two a task group): the scaling
                study's points (docs/results.md), never used to choose

One ``specui bench`` a (stage, set): the shipped drafter the stage replaces and every snapshot
(``--snapshot-steps``) in the same run, so one verifier load and one plain baseline serve them
all; ``--policy fixed`` (the raw drafter at its K: the cost model must not hide a drafter's
acceptance), T=0, 128 new tokens, one thread.  The two sets run side by side, one a core.  Each
bench's JSON lands in STATE/evals/<stage>-<set>.json once it is complete (its runs also go to the
store STATE/evals/bench.db), and a finished file is skipped: a stop loses at most the benches in
flight.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specui.paths import shipped_drafters_dir
from specui.training.campaign import TRAIN_FILE, mean_sequence_tokens
from specui.training.checkpoint import SNAPSHOTS

HELDOUT_PROMPTS = 12
SPEC_BENCH_PROMPTS = 12
EVAL_SETS = {"heldout": "campaign", "spec-bench": "spec-bench"}
MAX_NEW_TOKENS = 128
EVALS = "evals"


def eval_file(folder: Path, stage: str, name: str) -> Path:
    return folder / EVALS / f"{stage}-{name}.json"


def candidates(folder: Path, stage: str) -> list[Path]:
    """The shipped drafter ``stage`` replaces, then the stage's snapshots by step."""
    snaps = sorted((folder / "runs" / stage / SNAPSHOTS).glob("step-*"))
    shipped = shipped_drafters_dir() / stage
    return ([shipped] if shipped.is_dir() else []) + snaps


def command(drafters: Sequence[Path], name: str, db: Path) -> list[str]:
    limit = HELDOUT_PROMPTS if name == "heldout" else SPEC_BENCH_PROMPTS
    return _bench_command(drafters, EVAL_SETS[name], limit, "fixed", db)


def _bench_command(
    drafters: Sequence[str | Path], prompts: str, limit: int, policy: str, db: Path
) -> list[str]:
    args = ["--prompts", prompts, "--limit", str(limit), "--max-new-tokens", str(MAX_NEW_TOKENS)]
    args += ["--temperature", "0", "--policy", policy, "--threads", "1", "--db", str(db), "--json"]
    for d in drafters:
        args += ["--drafter", str(d)]
    return [sys.executable, "-m", "specui", "bench", *args]


def evaluate(
    folder: Path,
    stage: str,
    runner: Callable[[list[dict[str, object]]], list[int]] | None = None,
) -> list[Path]:
    """Bench ``stage``'s candidates on every set whose file is missing; the files, in EVAL_SETS
    order.  ``runner`` takes the jobs (``cmd``, ``out``, ``env``) and returns their exit codes."""
    drafters = candidates(folder, stage)
    jobs = []
    for name in EVAL_SETS:
        out = eval_file(folder, stage, name)
        if not out.is_file() and drafters:
            out.parent.mkdir(parents=True, exist_ok=True)
            # The held-out set reads this campaign's train.jsonl.
            env = {**os.environ, "SPECUI_CAMPAIGN_DIR": str(folder)}
            jobs.append(
                {"cmd": command(drafters, name, out.parent / "bench.db"), "out": out, "env": env}
            )
    codes = (runner or _run_side_by_side)(jobs)
    failed = [str(j["out"]) for j, rc in zip(jobs, codes, strict=True) if rc != 0]
    if failed:
        raise SystemExit(f"campaign evaluation failed: {', '.join(failed)} (see their .log)")
    return [eval_file(folder, stage, name) for name in EVAL_SETS]


def _run_side_by_side(jobs: list[dict[str, object]]) -> list[int]:
    """Each job at once (one thread each), its JSON written to a temporary name and moved into
    place only when the bench succeeded."""
    running = []
    for job in jobs:
        out = Path(str(job["out"]))
        tmp, log = out.with_suffix(".tmp"), out.with_suffix(".log")
        with tmp.open("w") as f, log.open("a") as err:
            proc = subprocess.Popen(job["cmd"], stdout=f, stderr=err, env=job["env"])  # type: ignore[arg-type]
        running.append((proc, tmp, out))
    codes = []
    for proc, tmp, out in running:
        rc = proc.wait()
        if rc == 0:
            tmp.replace(out)
        codes.append(rc)
    return codes


# The ship check, once every drafter is evaluated: each chosen snapshot beside the shipped drafter
# it would replace and n-gram lookup, on issue 49's acceptance sets: (prompt set, prompts, policy).
# The two fixed-K sets (counts only) run side by side; the adaptive one, whose speeds are its
# point, runs last and alone.
SHIP_SETS = {
    "ship-spec-bench": ("spec-bench", 48, "fixed"),  # tau, paired per prompt: what ships
    "ship-math": ("gsm-symbolic", 36, "fixed"),  # no regression on held-out math
    "ship-spec-bench-adaptive": ("spec-bench", 48, "adaptive"),  # speedup as users run it
}
CANDIDATES = "candidates"


def ship_check(
    folder: Path,
    stages: Sequence[str],
    runner: Callable[[list[dict[str, object]]], list[int]] | None = None,
) -> list[Path]:
    """Bench every stage's chosen snapshot (copied to STATE/candidates/campaign-<stage>, so that
    no two drafters of a run share a folder name) against the shipped ones on SHIP_SETS (the
    fixed-K sets side by side, then the adaptive one alone); the files (nothing until every
    stage has a choice)."""
    chosen = {stage: choose(folder, stage) for stage in stages}
    if any(c is None for c in chosen.values()):
        return []
    drafters: list[str | Path] = ["ngram"]
    for stage, point in chosen.items():
        shipped = shipped_drafters_dir() / stage
        if shipped.is_dir():
            drafters.append(shipped)
        drafters.append(_candidate(folder, stage, point.path))  # type: ignore[union-attr]
    jobs = []
    for name, (prompts, limit, policy) in SHIP_SETS.items():
        out = folder / EVALS / f"{name}.json"
        if not out.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            cmd = _bench_command(drafters, prompts, limit, policy, out.parent / "bench.db")
            env = dict(os.environ)
            if policy == "adaptive":
                # Its cost model measured now, on the quiet machine, not a cached curve from
                # whatever ran beside an earlier measure (a busy one is cached like a quiet one).
                env["SPECUI_REMEASURE_COSTS"] = "1"
            jobs.append({"cmd": cmd, "out": out, "env": env})
    run = runner or _run_side_by_side
    codes = [rc for i in range(0, len(jobs), 2) for rc in run(jobs[i : i + 2])]
    failed = [str(j["out"]) for j, rc in zip(jobs, codes, strict=True) if rc != 0]
    if failed:
        raise SystemExit(f"campaign ship check failed: {', '.join(failed)} (see their .log)")
    return [folder / EVALS / f"{name}.json" for name in SHIP_SETS]


def _candidate(folder: Path, stage: str, snapshot: Path) -> Path:
    dest = folder / CANDIDATES / f"campaign-{stage}"
    if not dest.is_dir():
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(snapshot, tmp)
        (tmp / "SNAPSHOT").write_text(f"{snapshot}\n")  # which step it is
        tmp.rename(dest)
    return dest


@dataclass(frozen=True)
class Point:
    """One candidate's two evaluations."""

    stage: str
    path: Path
    step: int  # 0: the shipped drafter the stage started from
    campaign_tokens: int  # sequence-token passes of this campaign before it
    heldout_tau: float | None
    spec_bench_tau: float | None
    spec_bench_ci: tuple[float, float] | None
    groups: dict[str, float] = field(default_factory=dict)


def points(folder: Path, stage: str) -> list[Point]:
    """What the stage's evaluation files say, a point per candidate, by step."""
    benches = {name: read_bench(eval_file(folder, stage, name)) for name in EVAL_SETS}
    rows = {name: bench_rows(bench) for name, bench in benches.items()}
    per_token = _tokens_per_step(folder, stage)
    out = []
    for path in candidates(folder, stage):
        step = int(path.name.split("-")[1]) if path.name.startswith("step-") else 0
        # A bench names a folder's drafter by the folder's name: the stage's, or step-N.
        held, bench = rows["heldout"].get(path.name), rows["spec-bench"].get(path.name)
        ci = None
        if bench and bench.get("acceptance_length_ci_low") is not None:
            ci = (bench["acceptance_length_ci_low"], bench["acceptance_length_ci_high"])
        out.append(
            Point(
                stage,
                path,
                step,
                round(step * per_token),
                _tau(held),
                _tau(bench),
                ci,
                group_taus(benches["spec-bench"], path.name),
            )
        )
    return out


def choose(folder: Path, stage: str) -> Point | None:
    """The snapshot with the best held-out tau (a later one on a tie); None before the held-out
    evaluation exists.  Never chosen by Spec-Bench."""
    scored = [p for p in points(folder, stage) if p.step and p.heldout_tau is not None]
    return max(scored, key=lambda p: (p.heldout_tau, p.step)) if scored else None


def _tokens_per_step(folder: Path, stage: str) -> float:
    try:
        run = json.loads((folder / "runs" / stage / "train_run.json").read_text())
        batch = int(run["config"]["batch_size"]) * int(run.get("world_size", 1))
        return batch * mean_sequence_tokens(folder / TRAIN_FILE)
    except (OSError, ValueError, KeyError):
        return 0.0


def read_bench(path: Path) -> dict:
    """A ``specui bench --json`` file; {} when it is missing or torn."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def bench_rows(bench: dict) -> dict[str, dict]:
    """A bench's runs by drafter name (a folder's drafter is named by the folder)."""
    return {str(r.get("drafter")): r for r in bench.get("runs", []) if r.get("drafter")}


def group_taus(bench: dict, drafter: str) -> dict[str, float]:
    """tau per task group of one drafter's row in a grouped ``specui bench --json`` (Spec-Bench);
    {} when ungrouped."""
    out = {}
    for group, rows in (bench.get("groups") or {}).items():
        row = next((r for r in rows if str(r.get("drafter")) == drafter), None)
        if row is not None:
            out[group] = float(row.get("acceptance_length") or 1.0)
    return out


def _tau(row: dict | None) -> float | None:
    if row is None:
        return None
    return float(row.get("acceptance_length") or 1.0)
