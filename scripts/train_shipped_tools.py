"""Helpers of scripts/train_shipped.sh (run through it, not by hand).

    python scripts/train_shipped_tools.py distill PROMPTS N MAX_NEW GEN_BS CACHE_DIR
    python scripts/train_shipped_tools.py heldout-file PROMPTS SKIP N OUT.jsonl
    python scripts/train_shipped_tools.py summary BENCH.json [BENCH.json ...]
    python scripts/train_shipped_tools.py calibrate DB FIT.json TEST.json OUT.json
    python scripts/train_shipped_tools.py convert ALGO RUN_DIR DEST [--num-speculative-tokens K]
    python scripts/train_shipped_tools.py card ALGO RUN_DIR DEST ROOT [--force]
    python scripts/train_shipped_tools.py report BENCH-T0.json BENCH-T1.json OUT.svg
    python scripts/train_shipped_tools.py scaling RUNS [--svg OUT.svg]   (scripts/scaling_study.sh)
    python scripts/train_shipped_tools.py campaign-scaling STATE [--svg OUT.svg]
        [--shipped-tokens dflash=N ...]   (the campaign's snapshots beside the from-scratch study)
    python scripts/train_shipped_tools.py campaign-acceptance STATE
        (issue 49's bars on the campaign's ship check; exit 1 while one is missed)
    python scripts/train_shipped_tools.py campaign-ship STATE [--dest DIR] [--dry-run]
        (each paired-better campaign drafter replaces the shipped one, with its card)

``distill`` is the self-distillation stage (the same cache ``specui train``
reads, so training skips it).  ``heldout-file`` writes held-out prompts
``SKIP .. SKIP+N`` of a set as JSONL (the DSpark temperature is fitted on them,
disjoint from the prompts the drafters are scored on).  ``summary`` prints tau /
speedup / per-position acceptance of ``specui bench --json`` files.
``calibrate`` fits temperature scaling on one run's confidences and reports
ECE / AUROC / Brier before and after on the other.  ``convert`` writes the
bf16 copy that ships; ``card`` checks the acceptance bar on that copy's
held-out bench rows and writes its model card (exit 1 when it misses the bar,
unless ``--force``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

BAR_TAU = 2.0  # every shipped drafter, held-out, T=0
BAR_SPEEDUP = 1.5  # the best drafter, same bench run
BAR_AUROC = 0.75  # DSpark's confidence head


def _threads() -> None:
    import torch

    torch.set_num_threads(int(os.environ.get("THREADS", "1")))


def distill(a: argparse.Namespace) -> None:
    _threads()
    from specui.data import load_prompts
    from specui.data.distill import self_distill
    from specui.verifier.model import Verifier

    v = Verifier.load("embedded")
    prompts = load_prompts(a.prompts, split="train", limit=a.n or None)  # never the held-out split
    t0 = time.time()

    def progress(done: int, total: int) -> None:
        print(
            f"distill: {done}/{total} missing responses generated, {time.time() - t0:.0f} s",
            flush=True,
        )

    samples = self_distill(v, prompts, a.max_new, a.gen_bs, a.cache_dir, progress=progress)
    tokens = sum(len(s.response_ids) for s in samples)
    print(
        f"distill: {len(samples)} samples, {tokens} response tokens (mean "
        f"{tokens / max(1, len(samples)):.0f})",
        flush=True,
    )


def heldout_file(a: argparse.Namespace) -> None:
    from specui.data import load_prompts

    prompts = load_prompts(a.prompts, split="eval", limit=a.skip + a.n)[a.skip :]
    if len(prompts) < a.n:
        sys.exit(f"only {len(prompts)} held-out prompts after the first {a.skip}")
    with open(a.out, "w") as f:
        for p in prompts:
            row = {"prompt": p.text} if p.text is not None else {"messages": list(p.messages)}
            f.write(json.dumps({"id": p.id, **row}) + "\n")


def _runs(path: str) -> list[dict]:
    return json.loads(Path(path).read_text())["runs"]


def _interval(r: dict, key: str, fmt: str = ".2f", suffix: str = "") -> str:
    """' [lo-hi]' (the 95% bootstrap interval over prompts) when the bench file has one."""
    lo, hi = r.get(f"{key}_ci_low"), r.get(f"{key}_ci_high")
    return "" if lo is None or hi is None else f" [{lo:{fmt}}{suffix}-{hi:{fmt}}{suffix}]"


def summary(a: argparse.Namespace) -> None:
    for path in a.files:
        print(f"== {path}")
        print(
            f"{'drafter':<10}{'K':>3}{'tau':>7}{'tok/s':>8}{'speedup':>9}  per-position acceptance "
            "a_1..a_K"
        )
        for r in _runs(path):
            pos = [r.get(f"acceptance_pos_{k}") for k in range(1, 17)]
            pos = [f"{p:.2f}" for p in pos if p is not None]
            tau, tps, sp = r.get("acceptance_length"), r.get("tokens_per_s"), r.get("speedup")
            print(
                f"{r.get('drafter', '?'):<10}{r.get('num_speculative_tokens') or '':>3}"
                f"{tau or 1.0:>7.2f}{tps or 0:>8.2f}{sp or 1.0:>8.2f}x  {' '.join(pos)}"
            )


def calibrate(a: argparse.Namespace) -> None:
    from specui.metrics.calibration import (
        ConfidenceMetrics,
        apply_temperature,
        fit_temperature,
        slot_rate_auroc,
    )
    from specui.metrics.confidence import confidence_report, load_confidences
    from specui.store import Store

    store = Store(a.db)

    def dspark_run(path: str) -> int:
        ids = [r["run_id"] for r in _runs(path) if r.get("algorithm") == "dspark"]
        if not ids:
            sys.exit(f"{path} has no dspark run")
        return ids[0]

    fit_id, test_id = dspark_run(a.fit), dspark_run(a.test)
    fit = load_confidences(store, [fit_id])
    test = load_confidences(store, [test_id])
    from specui.errors import SpecUIError

    try:
        t = fit_temperature(fit.confidences, fit.labels)
    except SpecUIError as e:  # e.g. an untrained head: every slot rejected
        print(f"dspark calibration: no temperature fitted ({e}); T = 1", flush=True)
        t = 1.0
    before = ConfidenceMetrics.of(test.confidences, test.labels)
    after = ConfidenceMetrics.of(apply_temperature(test.confidences, t), test.labels)
    report = confidence_report(store, [test_id], temperature=t)
    per_slot = [
        None if m is None else {"auroc": m.auroc, "ece": m.ece, "brier": m.brier, "n": m.n}
        for m in report.per_slot
    ]
    # Context for the AUROC: what the slot index alone achieves, and the view serving truncates
    # with (the running product over every drafted slot; calibrated slot by slot first).
    survive = load_confidences(store, [test_id], prefix=True)
    survive_calibrated = load_confidences(store, [test_id], prefix=True, temperature=t)
    out = {
        "temperature": t,
        "fit_run": fit_id,
        "test_run": test_id,
        "fit_slots": int(fit.confidences.size),
        "before": vars(before),
        "after": vars(after),
        "per_slot_after": per_slot,
        "slot_index_auroc": slot_rate_auroc(test),
        "prefix": {
            "raw": vars(ConfidenceMetrics.of(survive.confidences, survive.labels)),
            "calibrated": vars(
                ConfidenceMetrics.of(survive_calibrated.confidences, survive.labels)
            ),
            "slot_index_auroc": slot_rate_auroc(survive),
        },
    }
    Path(a.out).write_text(json.dumps(out, indent=2))
    print(
        f"dspark calibration: T={t:.3f}; held-out test slots {before.n}: ECE {before.ece:.3f} -> "
        f"{after.ece:.3f}, Brier {before.brier:.3f} -> {after.brier:.3f}, AUROC {after.auroc}"
    )


def convert(a: argparse.Namespace) -> None:
    """bf16 copy of a finished run into DEST (``data/drafters/ALGO``), without its card."""
    run, dest = Path(a.run_dir), Path(a.dest)
    if not (run / "config.json").is_file():
        sys.exit(f"ship {a.algo}: {run} holds no finished drafter")
    _threads()
    from specui.training.shipping import write_bf16
    from specui.verifier.model import Verifier

    size = write_bf16(run, dest, Verifier.load("embedded"), a.num_speculative_tokens)
    print(f"ship {a.algo}: wrote {dest} (bf16, {size / 2**20:.1f} MiB)")


# Why each drafter has the size it has: measured with bench/speedup_model.py on this 2-core CPU
# (details in the header of scripts/train_shipped.sh); repeated in every model card.
WHY = {
    "all": "Block / K 8: the size the papers and vLLM use and the bar is set at. Verifying 9 "
    "tokens costs ~1.2x one plain step in this CPU's default bf16 batch-invariant verify "
    "(1.6-1.9x in float32), so K 8 pays at a tau near 2; with such a tau K 3-5 pays a little more "
    "locally (README, K sweep), and `-k` picks it without retraining. Draft vocabulary: 8192 for "
    "the general corpus (its responses: 4096 tokens cover 95.9% of the tokens, 8192 99.0%; the "
    "math rounds used 4096, where GSM responses use a few hundred distinct tokens); a small head "
    "cuts drafting from 0.3-1.1 to 0.1-0.2 of a verifier step. Steps: what the machine time "
    "allowed, one torch thread each.",
    "dflash": "3 layers: drafting a block costs ~0.2 of a verifier step, only ~0.03 more than 2 "
    "layers; 64 anchors per sequence x batch 4 gives ~200 blocks per step.",
    "dspark": "The DFlash backbone (3 layers), first warm-started from the DFlash run, so the "
    "steps went to the Markov head (rank 256: the low-rank next-token coupling inside a block) "
    "and the confidence head.",
    "peagle": "2 layers, 8 depths in one pass; the verifier's embedding is frozen and not stored "
    "(its own would be 28 M of 37 M trainable parameters and 56 MB of bf16 in every clone).",
    "eagle3": "1 layer, as in EAGLE-3: it drafts K tokens in K sequential passes, so each layer "
    "costs K times; 4 training-time-test steps (a longer TTT made a step ~12 s at batch 4).",
}


BAR_GROUP_TAU = 1.5  # every task group of a grouped evaluation set (Spec-Bench), T=0
BAR_MATH_DROP = 0.1  # the most held-out math tau may fall from the drafter it replaces


def _math_check(root: Path, drafter: str) -> tuple[float, float, int] | None:
    """(new tau, replaced drafter's tau, prompts) on gsm-symbolic's held-out split, when measured.

    ROOT/bench-math-T0.json is the new drafters; ROOT/bench-math-old-T0.json the ones they
    replace, on the same prompts (greedy tau is deterministic, so the pair is exact)."""
    new, old = root / "bench-math-T0.json", root / "bench-math-old-T0.json"
    if not (new.is_file() and old.is_file()):
        return None
    pick = [next((r for r in _runs(f) if r.get("drafter") == drafter), None) for f in (new, old)]
    if None in pick:
        return None
    return (
        pick[0]["acceptance_length"] or 1.0,
        pick[1]["acceptance_length"] or 1.0,
        pick[0].get("num_prompts") or 0,
    )


def _bar_problems(
    algo: str,
    r0: dict,
    rows0: list[dict],
    calib: dict | None,
    groups: dict[str, float] | None = None,
    math: tuple[float, float, int] | None = None,
) -> list[str]:
    tau = r0.get("acceptance_length") or 1.0
    best = max((r.get("speedup") or 0.0) for r in rows0 if r.get("algorithm") not in (None, "none"))
    problems = []
    if tau < BAR_TAU:
        problems.append(f"held-out tau {tau:.2f} < {BAR_TAU}")
    low = {g: t for g, t in (groups or {}).items() if t < BAR_GROUP_TAU}
    if low:
        problems.append(
            "tau below "
            + f"{BAR_GROUP_TAU} in "
            + ", ".join(f"{g} ({t:.2f})" for g, t in low.items())
        )
    if math is not None and math[0] < math[1] - BAR_MATH_DROP:
        problems.append(
            f"held-out math tau {math[0]:.2f}, down from {math[1]:.2f} (more than {BAR_MATH_DROP})"
        )
    if best < BAR_SPEEDUP:
        problems.append(f"best speedup in the bench run {best:.2f}x < {BAR_SPEEDUP}x")
    if algo == "dspark":
        auroc = None if calib is None else calib["after"]["auroc"]
        if auroc is None or auroc < BAR_AUROC:
            if calib is None:
                problems.append("no calibration (run the calibrate stage)")
            else:  # AUROC is None when every scored slot had the same outcome
                problems.append(
                    f"confidence AUROC {'undefined' if auroc is None else f'{auroc:.3f}'} < "
                    f"{BAR_AUROC}"
                )
    return problems


def _wall_s(run: Path, cfg: dict) -> float:
    """Seconds of training steps (metrics.jsonl logs every log_every steps; a resumed run may
    repeat a step: count each once)."""
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    step_time = {m["step"]: m.get("step_time_s") or 0.0 for m in metrics}
    return sum(step_time.values()) * cfg["log_every"]


def _lineage(run: Path) -> list[tuple[Path, dict]]:
    """(run folder, its train_run.json) for ``run`` and each run it was warm-started from."""
    out: list[tuple[Path, dict]] = []
    while run is not None and (run / "train_run.json").is_file() and len(out) < 8:
        train_run = json.loads((run / "train_run.json").read_text())
        out.append((run, train_run))
        init = train_run["config"].get("init_from")
        run = Path(init) if init else None
    return out


def _run_summary(train_run: dict, own: bool) -> str:
    cfg = train_run["config"]
    text = (
        f"{train_run.get('step')} steps, batch {cfg['batch_size']}, lr {cfg['lr']} "
        f"({cfg['schedule']}, warmup {cfg['warmup_steps']})"
    )
    if not own:  # an earlier round: its own data and algorithm
        article = "an" if cfg["algorithm"][:1] in "aeiou" else "a"
        text = f"{article} {cfg['algorithm']} run on the first {cfg['num_prompts']} prompts, {text}"
    return text + ("" if cfg.get("init_from") else ", from scratch")


def _shipped_origin(lineage: list[tuple[Path, dict]], algo: str) -> list[str]:
    """A run warm-started from a shipped folder (which keeps no training record): say so, and where
    the card of the drafter it grew from is kept."""
    init = lineage[-1][1]["config"].get("init_from") if lineage else None
    if not init or (Path(init) / "train_run.json").is_file():
        return []
    return [
        f"- warm-started from: the drafter shipped before it (`{Path(init).name}`, trained on math "
        f"only); its model card is kept in `docs/shipped/math/cards/{algo}.md`"
    ]


def card(a: argparse.Namespace) -> None:
    """Check the bar on the SHIPPED copy's bench rows and write DEST/README.md (the model card).
    Exits 1 when the drafter misses the bar (the card says so); ``--force`` exits 0 anyway."""
    root, run, dest = Path(a.root), Path(a.run_dir), Path(a.dest)
    bench0, bench1 = root / "bench-T0.json", root / "bench-T1.json"
    if not bench0.is_file():
        sys.exit(f"card {a.algo}: no {bench0}; run the bench stage first")
    rows0 = _runs(bench0)
    r0 = next((r for r in rows0 if r.get("drafter") == dest.name), None)
    if r0 is None:
        sys.exit(f"card {a.algo}: {bench0} has no run of the shipped {dest.name}")
    cpath = root / "calibration-dspark.json"
    calib = json.loads(cpath.read_text()) if a.algo == "dspark" and cpath.is_file() else None
    from specui.training.campaign_eval import group_taus

    bench0_all = json.loads(bench0.read_text())
    groups = group_taus(bench0_all, dest.name)
    math_check = _math_check(root, dest.name)
    problems = _bar_problems(a.algo, r0, rows0, calib, groups, math_check)
    eval_set = r0.get("prompt_set") or "gsm-symbolic"
    lineage = _lineage(run)  # this run, then the runs it was warm-started from
    cfg = lineage[0][1]["config"]
    wall = sum(_wall_s(r, t["config"]) for r, t in lineage)
    distill_info = (
        (root / "distill.done").read_text().strip() if (root / "distill.done").is_file() else "?"
    )
    r1 = (
        next((r for r in _runs(bench1) if r.get("drafter") == dest.name), {})
        if bench1.is_file()
        else {}
    )
    pos0 = " ".join(f"{v:.3f}" for v in _acceptance(r0))
    pos1 = " ".join(f"{v:.3f}" for v in _acceptance(r1)) if r1 else "-"
    tau = r0.get("acceptance_length") or 1.0
    from safetensors import safe_open

    with safe_open(str(dest / "model.safetensors"), "pt") as f:
        # f.keys(): safe_open is not iterable
        n_params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118
    model_type = json.loads((dest / "config.json").read_text()).get(
        "speculators_model_type", a.algo
    )
    size = (dest / "model.safetensors").stat().st_size
    lines = [
        f"# {a.algo} drafter for SmolLM2-135M-Instruct (embedded verifier)",
        "",
        f"Speculators-format checkpoint (`speculators_model_type: {model_type}`), weights in bf16 "
        f"({n_params / 1e6:.2f} M parameters stored, {size / 2**20:.1f} MiB), trained with "
        "SpecUI's own pipeline (`scripts/train_shipped.sh`). The verifier's embedding and LM head "
        "are not stored where the format borrows them from the verifier.",
        "" if not problems else f"\n**Misses the acceptance bar: {'; '.join(problems)}.**\n",
        "## Training",
        "",
        "- data: self-distilled greedy responses of the verifier to the TRAINING split of "
        f"`{cfg['prompts']}` (first {cfg['num_prompts']} prompts, up to {cfg['max_new_tokens']} "
        f"new tokens): {distill_info}",
        f"- drafter: {cfg['layers']} layers, draft vocabulary {cfg['draft_vocab_size']}, "
        + {
            "dflash": f"block size {cfg['block_size']}, {cfg['max_anchors']} anchors per sequence, "
            f"mask token {cfg['mask_token_id']}",
            "dspark": f"block size {cfg['block_size']}, {cfg['max_anchors']} anchors per sequence, "
            f"mask token {cfg['mask_token_id']}, Markov rank {cfg['markov_rank']}, confidence head "
            "trained on the acceptance chance at temperature "
            f"{cfg.get('confidence_temperature', 1.0):g} (0: greedy, the argmaxes agree), BCE "
            f"weight {cfg.get('confidence_weight', 1.0):g}",
            "peagle": f"{cfg['num_depths']} depths per pass, mask token {cfg['mask_token_id']}, "
            "verifier embedding frozen",
            "eagle3": f"{cfg['ttt_steps']} training-time-test steps",
        }[a.algo],
        *[
            f"- {'optimisation' if i == 0 else 'warm-started from'}: {_run_summary(t, i == 0)}"
            for i, (_, t) in enumerate(lineage)
        ],
        *_shipped_origin(lineage, a.algo),
        f"- wall time: about {wall / 3600:.1f} h of training "
        f"steps{' in all' if len(lineage) > 1 else ''} on {platform.machine()} ({os.cpu_count()} "
        f"cores, shared with another training), {cfg['threads']} torch thread, fp32 compute",
        f"- why these sizes: {WHY[a.algo]} {WHY['all']}",
        "",
        "## Held-out evaluation",
        "",
        f"`specui bench --shipped --prompts {eval_set}` ({r0.get('num_prompts')} prompts, "
        + (
            "evaluation only: never trained on"
            if eval_set.startswith("spec-bench")
            else "the held-out split, never trained on"
        )
        + "), plain decoding in the same run, one torch thread; docs/results.md has the command. "
        "Verifier precision: "
        + {
            "bf16": "bf16, batch-invariant (`specui.verifier.batch_invariant`: bf16 matmuls, "
            "float32 residual stream, greedy output bit-identical to plain decoding)"
        }.get(r0.get("verifier_precision"), "float32")
        + ".",
        "",
        f"- T=0: tau {tau:.3f}{_interval(r0, 'acceptance_length')}, "
        f"{r0.get('tokens_per_s') or 0:.2f} tok/s, speedup "
        f"{r0.get('speedup') or 0:.2f}x{_interval(r0, 'speedup', suffix='x')}, K "
        f"{r0.get('num_speculative_tokens')} (brackets: 95% bootstrap interval over the prompts)",
        f"- per-position acceptance a_1..a_K (T=0): {pos0}",
        "- T=1: tau "
        f"{r1.get('acceptance_length') or float('nan'):.3f}{_interval(r1, 'acceptance_length')}, "
        f"speedup {r1.get('speedup') or float('nan'):.2f}x{_interval(r1, 'speedup', suffix='x')}; "
        f"a_1..a_K: {pos1}",
    ]
    if groups:
        lines += [
            "",
            "Per task group (T=0):",
            "",
            "| group | tau |",
            "|---|---|",
            *[f"| {g} | {t:.3f} |" for g, t in groups.items()],
        ]
    if math_check is not None:
        lines += [
            "",
            f"Held-out math (gsm-symbolic, {math_check[2]} prompts, T=0): tau {math_check[0]:.3f}; "
            f"the drafter it replaced (trained on math only): {math_check[1]:.3f}.",
        ]
    if calib is not None:
        b, c = calib["before"], calib["after"]
        lines += [
            "",
            "## Confidence head (DSpark)",
            "",
            f"Temperature scaling fitted on {calib['fit_slots']} draft slots of held-out prompts "
            f"disjoint from the scored ones: T = {calib['temperature']:.3f}. Scored: {b['n']} "
            "slots of the T=0 bench run.",
            "",
            "| | ECE | AUROC | Brier |",
            "|---|---|---|---|",
            f"| raw | {b['ece']:.4f} | {b['auroc']:.4f} | {b['brier']:.4f} |",
            f"| calibrated | {c['ece']:.4f} | {c['auroc']:.4f} | {c['brier']:.4f} |",
        ]
        if "prefix" in calib:  # calibrations written before the prefix view lack it
            pr, pc = calib["prefix"]["raw"], calib["prefix"]["calibrated"]
            lines += [
                "",
                "Scored as above, each slot's score is the head's own estimand: the slot is "
                "accepted given the slots before it were (slots after a step's first rejection "
                "have no outcome and are left out). The slot index alone (each slot scored by its "
                f"slot's acceptance rate) gives AUROC {calib['slot_index_auroc']:.4f} on the same "
                "slots.",
                "",
                "What serving truncates with, the running product prod_(j<=k) c_j (the chance the "
                "draft survives to slot k), against whether slot k was accepted, over all "
                f"{pr['n']} drafted slots:",
                "",
                "| prefix survival | ECE | AUROC | Brier |",
                "|---|---|---|---|",
                f"| raw | {pr['ece']:.4f} | {pr['auroc']:.4f} | {pr['brier']:.4f} |",
                f"| calibrated | {pc['ece']:.4f} | {pc['auroc']:.4f} | {pc['brier']:.4f} |",
                f"| slot index alone | - | {calib['prefix']['slot_index_auroc']:.4f} | - |",
            ]
        if b["auroc"] is not None and b["auroc"] < BAR_AUROC:
            lines += [
                "",
                "Why the head stays below the bar, and what was tried (a refit of its linear map, "
                "fine-tuning the drafter with the head on greedy acceptance): docs/results.md "
                "(the math rounds) and `bench/confidence_probe.py`.",
            ]
    (dest / "README.md").write_text("\n".join(lines) + "\n")
    print(
        f"card {a.algo}: wrote {dest / 'README.md'}"
        + (f"; MISSES THE BAR: {'; '.join(problems)}" if problems else "")
    )
    if problems and not a.force:
        sys.exit(1)


# --- the README's results table and per-position acceptance plot -----------------------------

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _acceptance(row: dict) -> list[float]:
    k_max = (
        row.get("num_speculative_tokens") or 32
    )  # slots past a drafter's own K were never drafted
    return [
        row[f"acceptance_pos_{k}"]
        for k in range(1, k_max + 1)
        if row.get(f"acceptance_pos_{k}") is not None
    ]


def _svg_panel(rows: list[dict], title: str, x0: float, w: float, h: float) -> list[str]:
    """One chart: a line per drafter, acceptance (0..1) over draft position 1..K."""
    drafted = [(r["drafter"], _acceptance(r)) for r in rows if _acceptance(r)]
    kmax = max((len(a) for _, a in drafted), default=1)
    left, top, pw, ph = x0 + 48, 34, w - 64, h - 80

    def xy(k: int, v: float) -> str:
        x = left + (k - 1) / max(kmax - 1, 1) * pw
        return f"{x:.1f},{top + (1 - v) * ph:.1f}"

    out = [f'<text x="{x0 + w / 2:.0f}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    for i in range(6):  # y grid 0, 0.2, .. 1
        v = i / 5
        y = top + (1 - v) * ph
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{v:.1f}</text>'
        )
    for k in range(1, kmax + 1):
        x = float(xy(k, 0).split(",")[0])
        out.append(
            f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle" font-size="11">{k}</text>'
        )
    out.append(
        f'<text x="{left + pw / 2}" y="{top + ph + 34}" text-anchor="middle" font-size="12">draft '
        "position k</text>"
    )
    for i, (name, acc) in enumerate(drafted):
        c = COLOURS[i % len(COLOURS)]
        pts = " ".join(xy(k, v) for k, v in enumerate(acc, start=1))
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{pts}"/>')
        out += [
            f'<circle cx="{p.split(",")[0]}" cy="{p.split(",")[1]}" r="3" fill="{c}"/>'
            for p in pts.split()
        ]
        ly = top + 14 + 16 * i
        out.append(
            f'<text x="{left + pw - 4}" y="{ly}" text-anchor="end" font-size="12" '
            f'fill="{c}">{name}</text>'
        )
    return out


def report(a: argparse.Namespace) -> None:
    """Print the README table (markdown) and write the acceptance plot (SVG, no plotting deps)."""
    runs = {t: _runs(path) for t, path in (("0", a.t0), ("1", a.t1))}
    print("| T | drafter | K | tau | per-position acceptance a_1..a_K | tokens/s | speedup |")
    print("|---|---|---|---|---|---|---|")
    for t, rows in runs.items():
        for r in rows:
            acc = " ".join(f"{v:.2f}" for v in _acceptance(r)) or "-"
            print(
                f"| {t} | {r.get('drafter')} | {r.get('num_speculative_tokens') or '-'} | "
                f"{r.get('acceptance_length') or 1.0:.2f}"
                f"{_interval(r, 'acceptance_length')} | {acc} | {r.get('tokens_per_s') or 0:.2f} "
                f"| {r.get('speedup') or 1.0:.2f}x"
                f"{_interval(r, 'speedup', suffix='x') if r.get('algorithm') != 'none' else ''} |"
            )
    w, h = 420, 300
    body = [f'<rect width="{2 * w}" height="{h}" fill="white"/>']
    body += _svg_panel(runs["0"], "held-out acceptance per position, T=0", 0, w, h)
    body += _svg_panel(runs["1"], "held-out acceptance per position, T=1", w, w, h)
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w}" height="{h}" '
        'font-family="sans-serif">\n' + "\n".join(body) + "\n</svg>\n"
    )
    Path(a.out).write_text(svg)
    print(f"wrote {a.out}", file=sys.stderr)


# --- the data-scaling study (scripts/scaling_study.sh) ----------------------------------------


def _general_tokens(n: int, cache: dict) -> tuple[int, int]:
    """(response, prompt + response) tokens of the first ``n`` general training prompts: what one
    epoch of the from-scratch study trained on, in the unit it reported and in the campaign's."""
    if n not in cache:
        from specui.data import load_prompts
        from specui.data.distill import self_distill
        from specui.verifier.model import Verifier

        if "verifier" not in cache:  # loaded once for all sizes
            cache["verifier"] = Verifier.load("embedded")
        prompts = load_prompts("general", split="train", limit=n)
        samples = self_distill(cache["verifier"], prompts, max_new_tokens=128)
        responses = sum(len(s.response_ids) for s in samples)
        cache[n] = (responses, responses + sum(len(s.prompt_ids) for s in samples))
    return cache[n]


def scaling(a: argparse.Namespace) -> None:
    """The scaling table (markdown) and plot (SVG: Spec-Bench tau over training tokens, log x)."""
    from specui.training.campaign_eval import group_taus

    root = Path(a.runs)
    points: dict[str, list[tuple[int, int, float, dict, float]]] = {}
    tokens: dict = {}
    for run in sorted(root.glob("*-*")):
        bench_file = run / "eval-spec-bench-T0.json"
        if not bench_file.is_file():
            continue
        algo, n = run.name.rsplit("-", 1)
        bench = json.loads(bench_file.read_text())
        row = next(r for r in bench["runs"] if r.get("algorithm") != "none")
        cfg = json.loads((run / "train_run.json").read_text())["config"]
        points.setdefault(algo, []).append(
            (
                int(n),
                _general_tokens(int(n), tokens)[0],
                row.get("acceptance_length") or 1.0,
                group_taus(bench, row["drafter"]),
                _wall_s(run, cfg),
                row,
            )
        )
    groups = sorted({g for pts in points.values() for p in pts for g in p[3]})
    print(
        "| drafter | prompts | training tokens | steps | Spec-Bench tau [95% CI] | "
        + " | ".join(groups)
        + " | training wall |"
    )
    print("|---|---|---|---|---|" + "---|" * len(groups) + "---|")
    for algo, pts in sorted(points.items()):
        for n, toks, tau, per_group, wall, row in sorted(pts, key=lambda p: p[0]):
            cfg = json.loads((root / f"{algo}-{n}" / "train_run.json").read_text())["config"]
            cells = " | ".join(f"{per_group.get(g, float('nan')):.2f}" for g in groups)
            ci = _interval(row, "acceptance_length")
            print(
                f"| {algo} | {n} | {toks:,} | {cfg['steps']} | {tau:.3f}{ci} | {cells} | "
                f"{wall / 60:.0f} min |"
            )
    if a.svg:
        series = {algo: [(p[1], p[2]) for p in pts] for algo, pts in points.items()}
        Path(a.svg).write_text(
            _curve_svg(series, "response tokens trained on (one epoch, log scale)")
        )
        print(f"wrote {a.svg}", file=sys.stderr)


# --- the campaign's scaling curve (issue 49) ----------------------------------------------------

FROM_SCRATCH = Path(__file__).resolve().parents[1] / "docs" / "scaling-from-scratch.csv"


def campaign_scaling(a: argparse.Namespace) -> None:
    """The campaign's snapshots (campaign_eval) beside the from-scratch study
    (docs/scaling-from-scratch.csv): a markdown table and an SVG of Spec-Bench tau against
    sequence tokens trained on, log x.  A campaign point's tokens are the shipped drafter's
    (``--shipped-tokens ALGO=N``, from its model card) plus the campaign's before it."""
    import csv

    from specui.training import campaign_eval
    from specui.training.campaign_train import BUDGET

    state = Path(a.state)
    shipped = {k: int(float(v)) for k, v in (x.split("=") for x in a.shipped_tokens)}
    series: dict[str, list[tuple]] = {}
    cache: dict = {}
    print("| drafter | from | tokens trained on | held-out tau | Spec-Bench tau [95% CI] |")
    print("|---|---|---|---|---|")
    with FROM_SCRATCH.open() as f:
        for r in csv.DictReader(f):
            tokens = _general_tokens(int(r["prompts"]), cache)[1]
            tau = float(r["spec_bench_tau"])
            series.setdefault(f"{r['drafter']} from scratch", []).append((tokens, tau))
            print(
                f"| {r['drafter']} | scratch, {r['prompts']} prompts | {tokens:,} | | {tau:.3f}"
                f" [{r['ci_low']}-{r['ci_high']}] |"
            )
    for stage in BUDGET:
        for p in campaign_eval.points(state, stage):
            if p.spec_bench_tau is None:
                continue
            tokens = shipped.get(stage, 0) + p.campaign_tokens
            series.setdefault(f"{stage} campaign", []).append((tokens, p.spec_bench_tau))
            where = "shipped" if p.step == 0 else f"campaign step {p.step}"
            ci = f" [{p.spec_bench_ci[0]:.2f}-{p.spec_bench_ci[1]:.2f}]" if p.spec_bench_ci else ""
            held = f"{p.heldout_tau:.3f}" if p.heldout_tau is not None else ""
            print(f"| {stage} | {where} | {tokens:,} | {held} | {p.spec_bench_tau:.3f}{ci} |")
    from specui.training.campaign_acceptance import BAR_TAU as target

    for name, pts in series.items():
        if "campaign" in name and len(pts) >= 2:
            print(_doubling_line(name, sorted(pts), target))
    if a.svg:
        Path(a.svg).write_text(_curve_svg(series, "sequence tokens trained on (log scale)"))
        print(f"wrote {a.svg}", file=sys.stderr)


def _doubling_line(name: str, pts: list[tuple[int, float]], target: float) -> str:
    """Where a curve bends and what it says the target would take: the tau gained per doubling
    of the tokens between consecutive points, and a least-squares line in log2(tokens) over the
    last half of the points (at least two), extrapolated to ``target``."""
    pairs = zip(pts, pts[1:], strict=False)
    steps = [(t1 - t0) / math.log2(n1 / n0) for (n0, t0), (n1, t1) in pairs if n1 > n0]
    tail = pts[len(pts) // 2 :] if len(pts) >= 4 else pts
    xs = [math.log2(n) for n, _ in tail]
    ys = [t for _, t in tail]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    line = f"{name}: tau per doubling between points " + ", ".join(f"{d:+.3f}" for d in steps)
    line += f"; last {len(tail)} points {slope:+.3f} per doubling"
    if ys[-1] >= target:
        return line + f"; at {target} already"
    if slope <= 0:
        return line + f"; {target} not reached on this trend"
    need = 2 ** (mx + (target - my) / slope)
    return line + f"; {target} at about {need:,.0f} tokens on this trend"


def campaign_acceptance(a: argparse.Namespace) -> None:
    """Issue 49's acceptance on the campaign's ship check: a markdown table, each chosen
    drafter against the one it would replace, and every bar it misses."""
    from specui.training import campaign_acceptance as ca

    found = ca.verdicts(Path(a.state))
    eagle3 = next((v.speedup for v in found if v.stage == "eagle3"), None)
    print(
        "| drafter | tau (shipped) | a_1 | tau - shipped [95% CI] | "
        + " | ".join(ca.LONG_GROUPS)
        + " | math tau (shipped) | speedup, adaptive | AUROC |"
    )
    print("|---" * (8 + len(ca.LONG_GROUPS)) + "|")
    missed = [f"tau bar: {p}" for p in ca.best_problems(found)]
    for v in found:
        shipped = f" ({v.shipped_tau:.2f})" if v.shipped_tau is not None else ""
        diff = "-"
        if v.paired is not None:
            d, lo, hi = v.paired
            diff = f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" + (" ships" if v.ships else "")
        groups = " | ".join(f"{v.groups[g]:.2f}" if g in v.groups else "-" for g in ca.LONG_GROUPS)
        math_tau = "-" if v.math_tau is None else f"{v.math_tau:.2f}"
        if v.shipped_math_tau is not None:
            math_tau += f" ({v.shipped_math_tau:.2f})"
        speed = "-" if v.speedup is None else f"{v.speedup:.2f}x"
        auroc = "-" if v.auroc is None else f"{v.auroc:.3f}"
        print(
            f"| {v.stage} | {v.tau:.2f}{shipped} | {v.a1:.2f} | {diff} | {groups} | {math_tau} |"
            f" {speed} | {auroc} |"
        )
        missed += [f"{v.stage}: {p}" for p in v.problems(eagle3)]
    print("\n".join(["", "bars missed:", *missed] if missed else ["", "every bar met"]))
    if missed:
        raise SystemExit(1)


def campaign_ship(a: argparse.Namespace) -> None:
    """Ship what the campaign's ship check found paired-better (``specui.training.campaign_ship``)
    and say, drafter by drafter, what shipped and why the others stay."""
    from specui.paths import shipped_drafters_dir
    from specui.training import campaign_ship as cs

    state = Path(a.state)
    dest = Path(a.dest) if a.dest else shipped_drafters_dir()
    if a.dry_run:
        shipments = cs.plan(state, dest)
    else:
        _threads()
        from specui.verifier.model import Verifier

        shipments = cs.ship(state, dest, Verifier.load("embedded"))
    if not shipments:
        sys.exit(f"campaign-ship: {state} has no ship check yet (the campaign runs it last)")
    for s in shipments:
        verb = ("would ship" if a.dry_run else "shipped") if s.ships else "keeps the shipped"
        line = f"{s.stage}: {verb} {s.dest}"
        if s.reasons:
            line += f" ({'; '.join(s.reasons)})"
        if s.ships and s.problems:
            line += f"; bars still missed: {'; '.join(s.problems)}"
        print(line)


def _curve_svg(series: dict[str, list[tuple[int, float]]], x_label: str) -> str:
    """Spec-Bench tau against tokens, log x, one line a series."""
    w, h, left, top = 620, 360, 56, 34
    pw, ph = w - left - 24, h - top - 56
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    lx0, lx1 = math.log10(min(xs)) - 0.1, math.log10(max(xs)) + 0.1
    y0, y1 = 1.0, max(1.5, math.ceil(max(ys) * 10 + 1) / 10)

    def xy(x: float, y: float) -> tuple[float, float]:
        return (
            left + (math.log10(x) - lx0) / (lx1 - lx0) * pw,
            top + (1 - (y - y0) / (y1 - y0)) * ph,
        )

    out = [
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{w / 2:.0f}" y="20" text-anchor="middle" font-size="14">Spec-Bench tau (T=0) '
        "against training tokens</text>",
    ]
    for i in range(6):
        y = y0 + (y1 - y0) * i / 5
        _, py = xy(10**lx0, y)
        out.append(
            f'<line x1="{left}" y1="{py:.1f}" x2="{left + pw}" y2="{py:.1f}" stroke="#ddd"/>'
        )
        out.append(
            f'<text x="{left - 6}" y="{py + 4:.1f}" text-anchor="end" font-size="11">{y:.2f}</text>'
        )
    for e in range(math.ceil(lx0), math.floor(lx1) + 1):
        px, _ = xy(10**e, y0)
        label = f"{10**e / 1e6:g}M" if e >= 6 else f"{10**e / 1e3:g}k"
        out.append(
            f'<text x="{px:.1f}" y="{top + ph + 16}" text-anchor="middle" '
            f'font-size="11">{label}</text>'
        )
    out.append(
        f'<text x="{left + pw / 2}" y="{top + ph + 36}" text-anchor="middle" font-size="12">'
        f"{x_label}</text>"
    )
    for i, (name, pts) in enumerate(sorted(series.items())):
        c = COLOURS[i % len(COLOURS)]
        dash = ' stroke-dasharray="4 3"' if "scratch" in name else ""
        coords = [xy(x, y) for x, y in sorted(pts)]
        out.append(
            f'<polyline fill="none" stroke="{c}" stroke-width="2"{dash} '
            f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in coords)}"/>'
        )
        out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{c}"/>' for x, y in coords]
        out.append(
            f'<text x="{left + 8}" y="{top + 14 + 16 * i}" font-size="12" fill="{c}">{name}</text>'
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        'font-family="sans-serif">\n' + "\n".join(out) + "\n</svg>\n"
    )


def paired(a: argparse.Namespace) -> None:
    """tau(new) - tau(old) on the prompts both runs finished, with its paired 95% interval:
    a drafter is shipped only where the interval lies above 0."""
    from specui.metrics.calibration import tau_difference_interval
    from specui.metrics.comparison import prompt_drafts
    from specui.store import Store

    store = Store(a.db)
    new, old = prompt_drafts(store, a.new), prompt_drafts(store, a.old)
    both = sorted(set(new) & set(old))
    got = tau_difference_interval([new[i] for i in both], [old[i] for i in both])
    if got is None:
        raise SystemExit("paired: fewer than two shared prompts with drafts")
    d, lo, hi = got
    verdict = "better" if lo > 0 else "worse" if hi < 0 else "not separable"
    print(
        f"paired: run {a.new} - run {a.old} over {len(both)} prompts: tau {d:+.3f} [{lo:+.3f}, "
        f"{hi:+.3f}] ({verdict})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("distill")
    p.add_argument("prompts")
    p.add_argument("n", type=int)
    p.add_argument("max_new", type=int)
    p.add_argument("gen_bs", type=int)
    p.add_argument("cache_dir")
    p.set_defaults(func=distill)
    p = sub.add_parser("heldout-file")
    p.add_argument("prompts")
    p.add_argument("skip", type=int)
    p.add_argument("n", type=int)
    p.add_argument("out")
    p.set_defaults(func=heldout_file)
    p = sub.add_parser("summary")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=summary)
    p = sub.add_parser("calibrate")
    p.add_argument("db")
    p.add_argument("fit")
    p.add_argument("test")
    p.add_argument("out")
    p.set_defaults(func=calibrate)
    p = sub.add_parser("convert")
    p.add_argument("algo")
    p.add_argument("run_dir")
    p.add_argument("dest")
    p.add_argument("--num-speculative-tokens", type=int, default=None)
    p.set_defaults(func=convert)
    p = sub.add_parser("card")
    p.add_argument("algo")
    p.add_argument("run_dir")
    p.add_argument("dest")
    p.add_argument("root")
    p.add_argument("--force", action="store_true")
    p.set_defaults(func=card)
    p = sub.add_parser("report")
    p.add_argument("t0")
    p.add_argument("t1")
    p.add_argument("out")
    p.set_defaults(func=report)
    p = sub.add_parser("paired")
    p.add_argument("db")
    p.add_argument("new", type=int)
    p.add_argument("old", type=int)
    p.set_defaults(func=paired)
    p = sub.add_parser("campaign-scaling")
    p.add_argument("state", help="the campaign's state folder (SPECUI_CAMPAIGN_DIR)")
    p.add_argument("--svg", default=None)
    p.add_argument(
        "--shipped-tokens",
        nargs="*",
        default=[],
        metavar="ALGO=N",
        help="sequence tokens the shipped drafter was trained on (its model card)",
    )
    p.set_defaults(func=campaign_scaling)
    p = sub.add_parser("campaign-acceptance")
    p.add_argument("state", help="the campaign's state folder (SPECUI_CAMPAIGN_DIR)")
    p.set_defaults(func=campaign_acceptance)
    p = sub.add_parser("campaign-ship")
    p.add_argument("state", help="the campaign's state folder (SPECUI_CAMPAIGN_DIR)")
    p.add_argument("--dest", default=None, help="default: the repository's data/drafters")
    p.add_argument("--dry-run", action="store_true", help="say what would ship; write nothing")
    p.set_defaults(func=campaign_ship)
    p = sub.add_parser("scaling")
    p.add_argument("runs")
    p.add_argument("--svg", default=None)
    p.set_defaults(func=scaling)
    a = ap.parse_args()
    a.func(a)


if __name__ == "__main__":
    main()
