"""Issue 49's last step: each campaign drafter that the ship check found paired-better replaces
the shipped one, in bf16, with a model card saying where it came from and what it measured.

    scripts/train_shipped_tools.py campaign-ship STATE [--dest data/drafters] [--dry-run]

A drafter ships only where its verdict says so (``campaign_acceptance.Verdict.ships``: the 95%
interval of its paired tau difference on Spec-Bench 48 lies above 0); the others stay as they
are, and the command says why.  Before a drafter is replaced its card is kept in
``docs/shipped/general/cards`` (the new card points there).  A shipped drafter's weights stay in
every clone for good, so each is replaced once: a drafter whose card already names this
campaign is left alone.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specui.paths import REPO_ROOT
from specui.training import campaign_acceptance as ca
from specui.training import campaign_eval as ce
from specui.training.campaign import TRAIN_FILE

CARDS_ARCHIVE = REPO_ROOT / "docs" / "shipped" / "general" / "cards"
CAMPAIGN_MARK = "trained by SpecUI's training campaign"  # in every card this module writes
SHIP_SETS_DOC = "docs/results.md"  # where the ship check's tables and commands are


@dataclass
class Shipment:
    """One stage's outcome: whether it ships, and why not where it does not."""

    stage: str
    ships: bool
    dest: Path
    reasons: list[str] = field(default_factory=list)  # why it stays (empty when it ships)
    problems: list[str] = field(default_factory=list)  # the bars it misses even so
    card: str | None = None


def already_shipped(dest: Path) -> bool:
    card = dest / "README.md"
    return card.is_file() and CAMPAIGN_MARK in card.read_text(encoding="utf-8")


def plan(folder: Path, dest_root: Path, found: list[ca.Verdict] | None = None) -> list[Shipment]:
    """What ``ship`` would do, stage by stage (nothing is written); ``found``: the verdicts, when
    the caller has them (each reads the store and bootstraps the paired intervals)."""
    found = ca.verdicts(folder) if found is None else found
    eagle3 = next((v.speedup for v in found if v.stage == "eagle3"), None)
    out = []
    for v in found:
        dest = dest_root / v.stage
        reasons = []
        if not v.ships:
            reasons.append("not paired-better than the shipped drafter on Spec-Bench 48")
        if already_shipped(dest):
            reasons.append(f"{dest} already holds a campaign drafter (weights ship once)")
        if not (folder / ce.CANDIDATES / ca.CANDIDATE.format(v.stage)).is_dir():
            reasons.append("no candidate folder")
        problems = [p for p in v.problems(eagle3) if not p.startswith("not paired-better")]
        out.append(Shipment(v.stage, not reasons, dest, reasons, problems))
    return out


def ship(
    folder: Path,
    dest_root: Path,
    verifier: Any,
    archive: Path = CARDS_ARCHIVE,
) -> list[Shipment]:
    """Replace each drafter that ships (bf16 weights and card; its old card archived first)."""
    from specui.training.shipping import write_bf16

    verdicts = ca.verdicts(folder)
    found = {v.stage: v for v in verdicts}
    eagle3 = found["eagle3"].speedup if "eagle3" in found else None
    best = ca.best_problems(verdicts)
    shipments = plan(folder, dest_root, verdicts)
    corpus = corpus_stats(folder) if any(s.ships for s in shipments) else (0, 0, 0.0)
    for s in shipments:
        if not s.ships:
            continue
        v = found[s.stage]
        candidate = folder / ce.CANDIDATES / ca.CANDIDATE.format(s.stage)
        tmp = s.dest.with_name(s.dest.name + ".shipping")
        shutil.rmtree(tmp, ignore_errors=True)
        write_bf16(candidate, tmp, verifier)
        s.card = card(v, folder, tmp, eagle3, best, corpus)
        (tmp / "README.md").write_text(s.card, encoding="utf-8")
        old_card = s.dest / "README.md"
        if old_card.is_file():
            archive.mkdir(parents=True, exist_ok=True)
            kept = archive / f"{s.stage}.md"
            if not kept.is_file():  # the first drafter it replaced is the one to keep
                shutil.copyfile(old_card, kept)
        old = s.dest.with_name(s.dest.name + ".replaced")
        shutil.rmtree(old, ignore_errors=True)
        if s.dest.is_dir():
            s.dest.rename(old)
        tmp.rename(s.dest)
        shutil.rmtree(old, ignore_errors=True)
    return shipments


# --- the card ------------------------------------------------------------------------------


def corpus_stats(folder: Path) -> tuple[int, int, float]:
    """(rows, response tokens, mean prompt + response tokens) of the campaign's training file, in
    one pass (``campaign.mean_sequence_tokens`` is the last)."""
    rows = tokens = prompt_tokens = 0
    with (folder / TRAIN_FILE).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                rows += 1
                tokens += len(row["response_ids"])
                prompt_tokens += int(row.get("prompt_tokens", 0))
    return rows, tokens, (tokens + prompt_tokens) / max(rows, 1)


def _wall_s(run: Path, up_to: int, log_every: int) -> float:
    """Seconds of training steps up to step ``up_to`` (metrics.jsonl logs every ``log_every``
    steps; a resumed run may log a step twice: each counts once)."""
    times: dict[int, float] = {}
    path = run / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                m = json.loads(line)
                if m.get("step", 0) <= up_to and m.get("step_time_s"):
                    times[m["step"]] = m["step_time_s"]
    return sum(times.values()) * log_every


def _shape(algo: str, cfg: dict) -> str:
    """The drafter's shape line (the same shapes as the drafter it replaces)."""
    layers = int(cfg["layers"])
    plural = "s" if layers > 1 else ""
    common = f"{layers} layer{plural}, draft vocabulary {cfg['draft_vocab_size']}"
    return common + {
        "dflash": f", block size {cfg.get('block_size')}, {cfg.get('max_anchors')} anchors a "
        f"sequence, mask token {cfg.get('mask_token_id')}",
        "dspark": f", block size {cfg.get('block_size')}, Markov rank {cfg.get('markov_rank')}, "
        "confidence head",
        "peagle": f", {cfg.get('num_depths')} depths a pass, the verifier's embedding frozen",
        "eagle3": f", {cfg.get('ttt_steps')} training-time-test steps, drafting K "
        f"{cfg.get('num_speculative_tokens')}",
    }.get(algo, "")


def _row(bench: dict, drafter: str) -> dict:
    return ce.bench_rows(bench).get(drafter, {})


def _ci(row: dict, key: str) -> str:
    lo, hi = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
    return f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""


def card(
    v: ca.Verdict,
    folder: Path,
    weights: Path,
    eagle3_speedup: float | None,
    best: list[str],
    corpus: tuple[int, int, float],
) -> str:
    """The model card of stage ``v.stage``'s chosen snapshot, written as ``weights`` holds it;
    ``corpus``: ``corpus_stats(folder)``."""
    from safetensors import safe_open

    run = folder / "runs" / v.stage
    train_run = json.loads((run / "train_run.json").read_text(encoding="utf-8"))
    cfg, world = train_run["config"], int(train_run.get("world_size", 1))
    candidate = folder / ce.CANDIDATES / ca.CANDIDATE.format(v.stage)
    snap = Path((candidate / "SNAPSHOT").read_text(encoding="utf-8").strip())
    step = int(snap.name.split("-")[1])
    points = {p.step: p for p in ce.points(folder, v.stage)}
    chosen, start = points.get(step), points.get(0)
    rows, response_tokens, mean_tokens = corpus
    per_step = int(cfg["batch_size"]) * world * mean_tokens
    with safe_open(str(weights / "model.safetensors"), "pt") as f:
        n_params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118
    size = (weights / "model.safetensors").stat().st_size
    evals = folder / ce.EVALS
    name = ca.CANDIDATE.format(v.stage)
    fixed = ce.read_bench(evals / "ship-spec-bench.json")
    new_row = _row(fixed, name)
    math_row = _row(ce.read_bench(evals / "ship-math.json"), name)
    fast_row = _row(ce.read_bench(evals / "ship-spec-bench-adaptive.json"), name)
    k = int(new_row.get("num_speculative_tokens") or 0)
    pos = " ".join(f"{new_row.get(f'acceptance_pos_{j}', 0.0):.3f}" for j in range(1, k + 1))
    wall = _wall_s(run, step, int(cfg.get("log_every", 1)))
    held = "" if chosen is None or chosen.heldout_tau is None else f"{chosen.heldout_tau:.3f}"
    held_old = "" if start is None or start.heldout_tau is None else f"{start.heldout_tau:.3f}"
    problems = v.problems(eagle3_speedup) + best
    lines = [
        f"# {v.stage} drafter for SmolLM2-135M-Instruct (embedded verifier)",
        "",
        f"Speculators-format checkpoint (`speculators_model_type: {v.stage}`), weights in bf16 "
        f"({n_params / 1e6:.2f} M parameters stored, {size / 2**20:.1f} MiB), {CAMPAIGN_MARK} "
        "(`scripts/campaign.sh`, issue 49) on a 2-core CPU. The verifier's embedding and LM head "
        "are not stored where the format borrows them from the verifier.",
        "",
        *([f"**Misses these bars of issue 49: {'; '.join(problems)}.**", ""] if problems else []),
        "## Training",
        "",
        f"- data: the campaign corpus (`campaign` prompt set; prompts and responses committed in "
        f"`data/corpus/campaign`, sources and licences in `data/corpus/README.md`): {rows:,} "
        f"prompts with the verifier's greedy responses ({response_tokens:,} response tokens, up "
        "to 256 a prompt), long documents and code, translation into English, second turns. Its "
        "48 held-out prompts, and every prompt sharing a passage with them, were never trained on "
        "(`docs/training.md`).",
        f"- drafter: {_shape(v.stage, cfg)}",
        f"- this round: step {step:,} of {int(cfg['steps']):,} (the snapshot with the best "
        f"held-out tau), batch {cfg['batch_size']} x {world} processes, lr {cfg['lr']:g} "
        f"({cfg['schedule']}, warmup {cfg['warmup_steps']}), bf16 autocast: about "
        f"{step * per_step / 1e6:.1f} M sequence-token passes",
        f"- warm-started from: `{Path(str(cfg.get('init_from'))).name}`, the drafter shipped "
        f"before it (its card is kept in `docs/shipped/general/cards/{v.stage}.md`)"
        if v.stage != "dspark"
        else "- warm-started from: the campaign's final DFlash (the heads trained on it)",
        f"- wall time: about {wall / 3600:.1f} h of training steps, one torch thread a process",
        "",
        "## Evaluation",
        "",
        "The campaign's ship check (`scripts/train_shipped_tools.py campaign-acceptance STATE`; "
        f"commands and tables in `{SHIP_SETS_DOC}`): Spec-Bench, {new_row.get('num_prompts')} "
        f"questions (evaluation only, never trained on), {ce.MAX_NEW_TOKENS} new tokens, T=0, "
        "one thread, the drafter it replaces and plain decoding in the same run.",
        "",
        f"- tau {v.tau:.3f}{_ci(new_row, 'acceptance_length')} at K {k}, against "
        + (f"{v.shipped_tau:.3f} for the drafter it replaces" if v.shipped_tau else "-")
        + (
            f"; paired by prompt, {v.paired[0]:+.3f} [{v.paired[1]:+.3f}, {v.paired[2]:+.3f}]"
            if v.paired
            else ""
        ),
        f"- per-position acceptance a_1..a_K: {pos}",
        f"- held-out tau (the campaign's held-out split, 12 prompts): {held or '-'}; the drafter "
        f"it replaces: {held_old or '-'}",
    ]
    if v.math_tau is not None:
        lines.append(
            f"- held-out math (gsm-symbolic, {math_row.get('num_prompts')} prompts): tau "
            f"{v.math_tau:.3f}"
            + (f", against {v.shipped_math_tau:.3f}" if v.shipped_math_tau is not None else "")
        )
    if v.speedup is not None:
        lines.append(
            f"- speed as users run it (the adaptive policy, {fast_row.get('num_prompts')} "
            f"Spec-Bench questions): {v.speedup:.2f}x plain decoding in the same run"
        )
    if v.auroc is not None:
        estimate = "its confidence head" if v.stage == "dspark" else "its top-1 probability"
        lines.append(f"- AUROC of {estimate} for a slot's acceptance (Spec-Bench): {v.auroc:.3f}")
    if v.groups:
        old_groups = ce.group_taus(fixed, v.stage)
        lines += ["", "| Spec-Bench group | tau | the drafter it replaces |", "|---|---|---|"]
        lines += [
            f"| {g} | {t:.3f} | {old_groups[g]:.3f} |"
            if g in old_groups
            else f"| {g} | {t:.3f} | - |"
            for g, t in v.groups.items()
        ]
    return "\n".join(lines) + "\n"
