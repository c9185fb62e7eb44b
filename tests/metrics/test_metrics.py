"""Comparison metrics and CSV files, checked against numbers computed here
independently from hand-built step traces."""

from __future__ import annotations

import csv
import math
import random
from pathlib import Path

import numpy as np
import pytest

from specui.errors import SpecUIError
from specui.metrics.calibration import (
    ConfidenceSamples,
    apply_temperature,
    auroc,
    bootstrap_indices,
    brier_score,
    expected_calibration_error,
    fit_temperature,
    ratio_interval,
    slot_rate_auroc,
)
from specui.metrics.columns import BASE_COLUMNS
from specui.metrics.comparison import compare
from specui.metrics.confidence import calibrate, confidence_report, load_confidences
from specui.metrics.csv import write_steps_csv
from specui.store import Backend, DecodingSettings, RunStatus, Store
from specui.trace import FinalTokenKind, StepTrace
from tests.support.store_helpers import make_trace, record


def _plain_step(i: int) -> StepTrace:
    """A baseline step: nothing drafted, one verifier token."""
    return StepTrace(
        i, 10 + i, [], [], [], [], None, 0, 7, "x", FinalTokenKind.BONUS, [7], 0.0, 0.02
    )


@pytest.fixture
def three_runs(
    tmp_path: Path,
) -> tuple[Store, dict[str, int], dict[str, list[list[StepTrace]]], dict[str, list[float]]]:
    store = Store(tmp_path / "specui.db")
    prompts = {
        "base": [[_plain_step(i) for i in range(n)] for n in (30, 40, 50)],
        "conf": [
            [make_trace(i, 3, seed=10 + p) for i in range(n)] for p, n in enumerate((12, 9, 20))
        ],
        "plain": [
            [make_trace(i, 5, seed=20 + p, confidences=False) for i in range(n)]
            for p, n in enumerate((8, 11))
        ],
    }
    walls = {"base": [1.5, 2.0, 2.6], "conf": [0.9, 0.7, 1.4], "plain": [0.8, 0.95]}
    ids = {}
    for name, algo, k, label in (
        ("base", "none", 0, None),
        ("conf", "dspark", 3, "=DSpark (cal)"),
        ("plain", "dflash", 5, None),
    ):
        run = store.create_run(
            verifier="smollm2",
            prompt_set="humaneval:0-2",
            algorithm=algo,
            label=label,
            owner="secret-session-id-123",
            settings=DecodingSettings(num_speculative_tokens=k, temperature=0.0, max_new_tokens=64),
        )
        record(store, run.id, prompts[name], walls[name], k)
        ids[name] = run.id
    yield store, ids, prompts, walls
    store.close()


def _expected(
    prompts: list[list[StepTrace]], walls: list[float], k_max: int, base_tpot: float | None
) -> dict[str, float | None]:
    steps = [s for p in prompts for s in p]
    drafts = [s for s in steps if s.draft_token_ids]
    accepted = sum(s.num_accepted for s in drafts)
    drafted = sum(len(s.draft_token_ids) for s in steps)
    tokens = sum(len(s.emitted_token_ids) for s in steps)
    wall = sum(walls)
    exp: dict[str, float | None] = {
        "num_steps": len(steps),
        "num_drafts": len(drafts),
        "num_output_tokens": tokens,
        "acceptance_length": 1 + accepted / len(drafts) if drafts else 1.0,
        "tokens_per_step": tokens / len(steps),
        "draft_acceptance_rate": accepted / drafted if drafted else None,
        "tokens_per_s": tokens / wall,
        "speedup": None if base_tpot is None else base_tpot / (wall / tokens),
    }
    own_k = max(
        [len(s.draft_token_ids) for s in steps] + [0]
    )  # slots past a run's own K: never drafted
    for k in range(1, k_max + 1):
        exp[f"acceptance_pos_{k}"] = (
            sum(1 for s in drafts if s.num_accepted >= k) / len(drafts)
            if drafts and k <= own_k
            else None
        )
    conf, lab = [], []
    for s in steps:
        for slot, c in enumerate(s.confidences or []):
            if slot > s.num_accepted:  # after the first rejection: no outcome for this slot
                continue
            conf.append(c)
            lab.append(1.0 if slot < s.num_accepted else 0.0)
    if conf:
        n = len(conf)
        exp["confidence_brier"] = sum((c - y) ** 2 for c, y in zip(conf, lab, strict=True)) / n
        pos = [c for c, y in zip(conf, lab, strict=True) if y]
        neg = [c for c, y in zip(conf, lab, strict=True) if not y]
        exp["confidence_auroc"] = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg) / (
            len(pos) * len(neg)
        )
        ece = 0.0
        for b in range(10):
            members = [(c, y) for c, y in zip(conf, lab, strict=True) if min(int(c * 10), 9) == b]
            if members:
                ece += (
                    len(members)
                    / n
                    * abs(
                        sum(y for _, y in members) / len(members)
                        - sum(c for c, _ in members) / len(members)
                    )
                )
        exp["confidence_ece"] = ece
        # Baseline: each kept slot scored by the acceptance rate of its slot index.
        by_slot: dict[int, list[float]] = {}
        for s in steps:
            for slot in range(min(len(s.confidences or []), s.num_accepted + 1)):
                by_slot.setdefault(slot, []).append(1.0 if slot < s.num_accepted else 0.0)
        rate = {k: sum(v) / len(v) for k, v in by_slot.items()}
        scored = [(rate[k], y) for k, ys in by_slot.items() for y in ys]
        pos_r = [r for r, y in scored if y]
        neg_r = [r for r, y in scored if not y]
        exp["confidence_auroc_slot_index"] = sum(
            (p > q) + 0.5 * (p == q) for p in pos_r for q in neg_r
        ) / (len(pos_r) * len(neg_r))
    else:
        exp.update(
            confidence_brier=None,
            confidence_auroc=None,
            confidence_ece=None,
            confidence_auroc_slot_index=None,
        )
    return exp


def test_comparison_csv_matches_independent_computation(three_runs, tmp_path: Path) -> None:
    store, ids, prompts, walls = three_runs
    out = tmp_path / "cmp.csv"
    compare(store, [ids["base"], ids["conf"], ids["plain"]]).to_csv(out)
    text = out.read_text(encoding="utf-8")
    assert (
        "secret-session-id-123" not in text and "hostname" not in text
    )  # no session ids, no hosts
    with out.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames
        rows = list(reader)
    assert header == [c.key for c in BASE_COLUMNS] + [f"acceptance_pos_{k}" for k in range(1, 6)]
    assert all(h.isidentifier() and h == h.lower() for h in header)

    for row, name in zip(rows, ("base", "conf", "plain"), strict=True):
        # Speedup over the prompts both runs finished ("plain" has only the first two).
        n = len(prompts[name])
        base_tpot = sum(walls["base"][:n]) / sum(
            len(s.emitted_token_ids) for p in prompts["base"][:n] for s in p
        )
        exp = _expected(prompts[name], walls[name], 5, base_tpot)
        assert int(row["run_id"]) == ids[name]
        assert row["baseline_run_id"] == str(ids["base"])
        assert row["status"] == "done" and row["num_prompts"] == str(len(prompts[name]))
        for key, value in exp.items():
            if value is None:
                assert row[key] == "", (name, key)
            else:
                assert float(row[key]) == pytest.approx(value, rel=1e-12), (name, key)
    assert rows[0]["speedup"] == "1.0"
    assert rows[1]["label"] == "'=DSpark (cal)"  # a spreadsheet must not run it as a formula
    assert (
        rows[1]["acceptance_pos_4"] == ""
    )  # K=3 run: slot 4 never drafted (blank, not 0), column shared


def test_steps_csv_has_one_row_per_step_with_the_stored_values(three_runs, tmp_path: Path) -> None:
    store, ids, prompts, _ = three_runs
    out = tmp_path / "steps.csv"
    write_steps_csv(store, [ids["conf"]], out, bom=True)
    raw = out.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf")  # Excel's UTF-8 marker, on request
    with out.open(newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    flat = [(p, s) for p, steps in enumerate(prompts["conf"]) for s in steps]
    assert len(rows) == len(flat)
    for row, (p, s) in zip(rows, flat, strict=True):
        assert (int(row["prompt_index"]), int(row["step"])) == (p, s.step)
        assert int(row["num_accepted"]) == s.num_accepted and int(row["num_drafted"]) == len(
            s.draft_token_ids
        )
        assert [int(t) for t in eval(row["draft_token_ids"])] == s.draft_token_ids
        assert float(row["verify_time_s"]) == s.verify_time_s
        assert row["final_token_kind"] == str(s.final_token_kind)
        expected_text = (
            "'" + s.final_token_text if s.final_token_text.startswith("=") else s.final_token_text
        )
        assert row["final_token_text"] == expected_text


def test_speedup_prefers_a_baseline_of_the_same_backend_and_prompts(three_runs) -> None:
    store, ids, _, _ = three_runs
    # No vLLM baseline, and none on the other prompt set: no speedup rather than a misleading one.
    vllm = store.create_run(
        verifier="smollm2", prompt_set="humaneval:0-2", algorithm="dflash", backend=Backend.VLLM
    )
    record(store, vllm.id, [[make_trace(i, 3) for i in range(5)]], [0.5], 3)
    other_set = store.create_run(verifier="smollm2", prompt_set="gsm8k:0-0", algorithm="dflash")
    record(store, other_set.id, [[make_trace(i, 3) for i in range(5)]], [0.5], 3)
    cmp = compare(store, [vllm.id, other_set.id, ids["plain"]])
    assert cmp.values("speedup")[:2] == [None, None]
    assert cmp.values("baseline_run_id") == [None, None, ids["base"]]


def test_speedup_is_over_a_plain_run_of_the_same_verifier_precision(tmp_path: Path) -> None:
    store = Store(tmp_path / "p.db")

    def run(algorithm: str, precision: str, k: int, wall: float) -> int:
        settings = DecodingSettings(
            num_speculative_tokens=k, max_new_tokens=64, extra={"verifier_precision": precision}
        )
        r = store.create_run(
            verifier="v", prompt_set="eval", algorithm=algorithm, settings=settings
        )
        record(store, r.id, [[make_trace(i, k) for i in range(5)]], [wall], k)
        return r.id

    plain_bf16 = run("none", "bf16", 0, 1.0)
    plain_fp32 = run(
        "none", "fp32", 0, 2.0
    )  # newer, and slower: the wrong one would flatter the bf16 run
    spec_bf16, spec_fp32 = run("dflash", "bf16", 3, 0.5), run("dflash", "fp32", 3, 1.0)
    cmp = compare(store, [spec_bf16, spec_fp32])
    assert cmp.values("baseline_run_id") == [plain_bf16, plain_fp32]
    assert cmp.values("verifier_precision") == ["bf16", "fp32"]


def test_unknown_run_in_a_comparison_is_a_clear_error(three_runs, tmp_path: Path) -> None:
    store, ids, _, _ = three_runs
    with pytest.raises(SpecUIError, match="unknown run id 424242"):
        compare(store, [ids["base"], 424242])
    out = tmp_path / "never.csv"
    with pytest.raises(SpecUIError, match="unknown run id 424242"):
        write_steps_csv(store, [424242], out)
    assert not out.exists()


def test_columns_carry_label_definition_and_unit(three_runs) -> None:
    store, ids, _, _ = three_runs
    cmp = compare(store, [ids["conf"]])
    for c in cmp.columns:
        assert c.label and c.definition
    assert cmp.column("tokens_per_s").unit == "tokens/s"
    assert "bonus" in cmp.column("acceptance_length").definition
    assert cmp.column("acceptance_pos_2").label == "a_2"


def test_confidence_metrics_on_small_known_cases() -> None:
    conf, lab = [0.1, 0.1, 0.9, 0.9], [0, 1, 1, 1]
    assert expected_calibration_error(conf, lab) == pytest.approx(0.5 * 0.4 + 0.5 * 0.1)
    assert brier_score(conf, lab) == pytest.approx((0.01 + 0.81 + 0.01 + 0.01) / 4)
    assert auroc(conf, lab) == pytest.approx((1 + 1 + 0.5) / 3)  # positives .1,.9,.9 vs negative .1
    assert auroc([0.2, 0.8], [1, 1]) is None
    assert auroc([0.9, 0.8, 0.1], [1, 1, 0]) == 1.0


def test_temperature_scaling_recovers_a_known_temperature() -> None:
    rng = np.random.default_rng(0)
    z = rng.normal(0.0, 3.0, 40_000)
    labels = rng.random(z.size) < 1 / (1 + np.exp(-z / 2.5))  # truth: logits are 2.5x too sharp
    conf = 1 / (1 + np.exp(-z))
    t = fit_temperature(conf, labels)
    assert t == pytest.approx(2.5, rel=0.05)

    def nll(temp: float) -> float:
        p = np.clip(apply_temperature(conf, temp), 1e-12, 1 - 1e-12)
        return float(-np.mean(labels * np.log(p) + (~labels) * np.log(1 - p)))

    assert nll(t) <= min(nll(t * 0.98), nll(t * 1.02))
    assert (
        expected_calibration_error(apply_temperature(conf, t), labels)
        < expected_calibration_error(conf, labels) / 3
    )
    with pytest.raises(SpecUIError, match="both accepted and rejected"):
        fit_temperature([0.3, 0.9], [1, 1])


def test_calibration_fits_on_one_run_and_reports_on_another(tmp_path: Path) -> None:
    rng = random.Random(1)

    def overconfident(i: int, seed: int) -> StepTrace:
        t = make_trace(i, 4, seed=seed)
        # Confidences much sharper than the acceptance they predict.
        t.confidences = [1 / (1 + math.exp(-3 * (1.5 - k + rng.gauss(0, 1)))) for k in range(4)]
        t.num_accepted = next(
            (k for k in range(4) if rng.random() > 1 / (1 + math.exp(-(1.5 - k)))), 4
        )
        return t

    with Store(tmp_path / "s.db") as store:
        fit_run = store.create_run(verifier="v", prompt_set="train", algorithm="dspark")
        eval_run = store.create_run(verifier="v", prompt_set="eval", algorithm="dspark")
        record(store, fit_run.id, [[overconfident(i, 1) for i in range(1500)]], [1.0], 4)
        eval_traces = [overconfident(i, 2) for i in range(1500)]
        record(store, eval_run.id, [eval_traces], [1.0], 4)
        cal = calibrate(store, [fit_run.id], [eval_run.id])
        assert cal.temperature > 1.5  # the head was overconfident
        assert cal.after.ece < cal.before.ece
        assert cal.after.auroc == pytest.approx(
            cal.before.auroc
        )  # a monotone map keeps the ranking
        report = confidence_report(store, [eval_run.id])
        # Slots up to the first rejected one have an outcome; later ones are left out.
        observed = sum(min(t.num_accepted + 1, 4) for t in eval_traces)
        assert (
            report is not None
            and len(report.per_slot) == 4
            and sum(b.count for b in report.reliability) == observed < 6000
        )
        plain = store.create_run(verifier="v", prompt_set="eval", algorithm="dflash")
        store.finish_run(plain.id, RunStatus.DONE)
        assert confidence_report(store, [plain.id]) is None


def test_prefix_confidences_are_running_products_against_every_drafted_slot(tmp_path: Path) -> None:
    steps = [([0.9, 0.5, 0.2], 1), ([0.8, 0.75], 2), ([0.6, 0.1, 0.5, 0.5], 0)]
    traces = []
    for i, (conf, n_acc) in enumerate(steps):
        t = make_trace(i, len(conf), seed=i)
        t.confidences, t.num_accepted = conf, n_acc
        traces.append(t)
    with Store(tmp_path / "s.db") as store:
        run = store.create_run(verifier="v", prompt_set="eval", algorithm="dspark")
        record(store, run.id, [traces], [1.0], 4)
        own = load_confidences(store, [run.id])
        survive = load_confidences(store, [run.id], prefix=True)
    # The head's own view: slots up to the first rejection, scored as stored.
    assert own.confidences.tolist() == pytest.approx([0.9, 0.5, 0.8, 0.75, 0.6])
    assert own.labels.tolist() == [True, False, True, True, False]
    # Serving's view: every slot, scored by the product so far (each step restarts it).
    assert survive.confidences.tolist() == pytest.approx(
        [0.9, 0.45, 0.09, 0.8, 0.6, 0.6, 0.06, 0.03, 0.015]
    )
    assert survive.labels.tolist() == [True, False, False, True, True, False, False, False, False]
    assert survive.slots.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]


def test_slot_rate_baseline_scores_the_slot_index_alone() -> None:
    # Slot 0 accepted 3 of 4 times, slot 1 once in 4: the baseline ranks every slot-0 sample
    # above every slot-1 sample, whatever the head said.
    slots = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    labels = np.array([1, 1, 1, 0, 1, 0, 0, 0], dtype=bool)
    head = np.array([0.1, 0.2, 0.3, 0.4, 0.9, 0.8, 0.7, 0.6])  # anti-informative
    samples = ConfidenceSamples(head, labels, slots)
    expected = auroc(np.where(slots == 0, 0.75, 0.25), labels)
    assert slot_rate_auroc(samples) == pytest.approx(expected) and expected > 0.5 > auroc(
        head, labels
    )
    assert (
        slot_rate_auroc(
            ConfidenceSamples(np.zeros(0), np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64))
        )
        is None
    )


# --- bootstrap intervals ----------------------------------------------------------------


def _percentile_interval(values: list[float]) -> tuple[float, float]:
    return tuple(np.quantile(values, [0.025, 0.975]))  # type: ignore[return-value]


def test_intervals_of_a_comparison_match_an_independent_bootstrap_over_prompts(three_runs) -> None:
    """tau's interval resamples prompts of the run; speedup's resamples the run and its
    baseline by the same prompts.  Recomputed here with plain loops over the same draws."""
    store, ids, prompts, walls = three_runs
    rows = {r["run_id"]: r for r in compare(store, [ids["base"], ids["conf"], ids["plain"]]).rows}
    for name in ("conf", "plain"):
        row, runs = rows[ids[name]], prompts[name]
        n = len(runs)
        draws = bootstrap_indices(n)
        taus, speedups = [], []
        for draw in draws:
            picked = [runs[i] for i in draw]
            drafts = sum(1 for p in picked for s in p if s.draft_token_ids)
            taus.append(
                1 + sum(s.num_accepted for p in picked for s in p if s.draft_token_ids) / drafts
            )
            tpot = sum(walls[name][i] for i in draw) / sum(
                len(s.emitted_token_ids) for i in draw for s in runs[i]
            )
            base_tpot = sum(walls["base"][i] for i in draw) / sum(
                len(s.emitted_token_ids) for i in draw for s in prompts["base"][i]
            )
            speedups.append(base_tpot / tpot)
        lo, hi = _percentile_interval(taus)
        assert (row["acceptance_length_ci_low"], row["acceptance_length_ci_high"]) == (
            pytest.approx(lo),
            pytest.approx(hi),
        )
        assert (
            row["acceptance_length_ci_low"]
            <= row["acceptance_length"]
            <= row["acceptance_length_ci_high"]
        )
        assert (
            row["acceptance_length_ci_low"] < row["acceptance_length_ci_high"]
        )  # prompts differ: a real spread
        lo, hi = _percentile_interval(speedups)
        assert (row["speedup_ci_low"], row["speedup_ci_high"]) == (
            pytest.approx(lo),
            pytest.approx(hi),
        )
    base = rows[ids["base"]]
    assert base["speedup_ci_low"] == pytest.approx(1.0) and base[
        "speedup_ci_high"
    ] == pytest.approx(1.0)
    assert base["acceptance_length_ci_low"] is None  # nothing drafted: tau is 1 by definition


def test_ratio_interval_collapses_when_every_prompt_agrees_and_needs_two_prompts() -> None:
    assert ratio_interval([2.0, 4.0, 6.0], [1.0, 2.0, 3.0]) == (
        pytest.approx(2.0),
        pytest.approx(2.0),
    )
    assert ratio_interval([3.0], [1.0]) is None
    assert ratio_interval([1.0, 0.0], [1.0, 0.0]) is None  # a resample of only the empty prompt
    # Paired: both runs twice as slow on prompt 1 -> the speedup does not move at all.
    paired = ratio_interval([1.0, 2.0], [10.0, 10.0], base_num=[2.0, 4.0], base_den=[10.0, 10.0])
    assert paired == (pytest.approx(2.0), pytest.approx(2.0))


def test_ratio_interval_covers_the_true_ratio_about_95_percent_of_the_time() -> None:
    """Coverage: 300 simulated 12-prompt runs from a known population (drafts ~ steps per
    prompt, accepted ~ Binomial); a 95% interval should hold the population ratio in roughly
    95% of them.  The percentile bootstrap under-covers a little at n=12 (about 90-93%);
    below 85% would mean a broken interval (e.g. resampling slots instead of prompts)."""
    rng = np.random.default_rng(7)
    p_true, hits, trials = 0.6, 0, 300
    for t in range(trials):
        drafts = rng.integers(20, 80, size=12)
        # Prompts differ in difficulty (the overdispersion real prompts have): per-prompt rate.
        rates = np.clip(rng.normal(p_true, 0.15, size=12), 0.01, 0.99)
        accepted = rng.binomial(drafts, rates)
        lo, hi = ratio_interval(accepted, drafts, resamples=500, seed=t)  # type: ignore[misc]
        hits += lo <= p_true <= hi
    assert 0.85 <= hits / trials <= 0.995, hits / trials


def test_compare_chart_draws_each_interval_as_whiskers(three_runs) -> None:
    from specui.ui.compare import charts

    store, ids, _, _ = three_runs
    run_ids = [ids["base"], ids["conf"]]
    c = compare(store, run_ids)
    _, bars, _, _ = charts(c)
    conf_row = c.rows[1]
    trace = next(t for t in bars.data if t.name.startswith(f"{ids['conf']}:"))
    assert trace.error_y.array[0] == pytest.approx(
        conf_row["acceptance_length_ci_high"] - conf_row["acceptance_length"]
    )
    assert trace.error_y.arrayminus[1] == pytest.approx(
        conf_row["speedup"] - conf_row["speedup_ci_low"]
    )
    base_trace = next(t for t in bars.data if t.name.startswith(f"{ids['base']}:"))
    assert base_trace.error_y.array[0] is None  # the baseline's tau is 1 by definition: no whisker


def test_compare_returns_the_charts_data_so_drawing_reads_no_steps(three_runs) -> None:
    """The tokens-per-step histogram and the reliability bins come with the comparison and
    equal what a reload of every step (the tab's old way) gives."""
    from collections import Counter

    from specui.ui.compare import charts

    store, ids, _, _ = three_runs
    run_ids = [ids["base"], ids["conf"], ids["plain"]]
    c = compare(store, run_ids)
    for rid in run_ids:
        reloaded = Counter(1 + s.num_accepted for s in store.get_steps(rid) if s.num_drafted)
        assert c.tokens_per_step[rid] == dict(reloaded)
    assert c.tokens_per_step[ids["base"]] == {}  # nothing drafted: no bars
    report = confidence_report(store, [ids["conf"]])
    assert report is not None and c.reliability[ids["conf"]] == report.reliability
    assert set(c.reliability) == {ids["conf"]}  # only the run with a confidence head
    _, _, hist, rel = charts(c)
    drawn = {int(t.name): dict(zip(t.x, t.y, strict=True)) for t in hist.data}
    assert drawn == {rid: c.tokens_per_step[rid] for rid in (ids["conf"], ids["plain"])}
    assert [t.name for t in rel.data] == ["perfect", f"run {ids['conf']}"]


def test_prompt_drafts_are_each_prompts_drafts_and_accepted_tokens(three_runs) -> None:
    """What the paired ship check resamples: per prompt, the steps that drafted and the
    tokens they accepted, counted here from the recorded traces; tau of their sums is the
    comparison's tau."""
    from specui.metrics.comparison import prompt_drafts

    store, ids, prompts, _ = three_runs
    got = prompt_drafts(store, ids["conf"])
    want = {
        i: (
            sum(1 for s in p if s.draft_token_ids),
            sum(s.num_accepted for s in p if s.draft_token_ids),
        )
        for i, p in enumerate(prompts["conf"])
    }
    assert got == want
    tau = 1 + sum(a for _, a in got.values()) / sum(d for d, _ in got.values())
    row = compare(store, [ids["conf"]]).rows[0]
    assert row["acceptance_length"] == pytest.approx(tau)
    with pytest.raises(SpecUIError):
        prompt_drafts(store, 424242)
