"""Compare tab: select runs, see the labelled comparison table and charts, download CSV,
launch a new benchmark in the background."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd
import plotly.graph_objects as go
from pandas.io.formats.style import Styler

from specui.algorithms.simple import BUILTIN
from specui.algorithms.spec import algorithm_names
from specui.choices import ui_drafter, ui_prompts
from specui.data import prompt_sets
from specui.errors import SpecUIError
from specui.jobs import queue as jobs
from specui.metrics.columns import Column
from specui.metrics.comparison import Comparison, compare
from specui.paths import data_dir
from specui.store import Store
from specui.ui.refusals import refuse
from specui.workbench import drafter_choices

ALL = "(all)"
FINGERPRINT_SHOWN = 8  # hex digits of a weights fingerprint the table and the filter show
UNKNOWN_WEIGHTS = "unknown weights"


def short_fingerprint(fingerprint: str | None) -> str:
    return (fingerprint or "")[:FINGERPRINT_SHOWN]


def prompt_set_label(prompt_set: str | None) -> str:
    """A prompt set as the table shows it: a JSONL file (or a path) by its file name, each
    part of an ``a,b`` mix on its own; the stored value keeps the whole path."""
    if not prompt_set:
        return ""
    parts = prompt_set.split(",")
    return ",".join(Path(p).name if p.lower().endswith(".jsonl") or "/" in p else p for p in parts)


def verifier_choices(store: Store) -> dict[str, tuple[str, str | None]]:
    """Filter label -> (verifier name, weights fingerprint or None).  A name whose runs have
    one weight set is its plain name; a name with several gets ``name (fingerprint)`` per
    set, so two weight sets of one model are two verifiers to choose from."""
    pairs = store.list_verifiers()
    names = [name for name, _ in pairs]
    out: dict[str, tuple[str, str | None]] = {}
    for name, fp in pairs:
        if names.count(name) == 1:
            out[name] = (name, fp)
        else:
            out[f"{name} ({short_fingerprint(fp) or UNKNOWN_WEIGHTS})"] = (name, fp)
    return out


def run_choices(
    store: Store,
    algorithm: str = ALL,
    verifier: str = ALL,
    prompt_set: str = ALL,
    backend: str = ALL,
) -> list[str]:
    def given(value: str) -> str | None:
        return None if value in (ALL, None, "") else value

    name, weights, every_set = given(verifier), None, True
    choices = verifier_choices(store) if name is not None else {}
    if verifier in choices:
        name, weights = choices[verifier]
        every_set = name == verifier  # a plain name: the name has one weight set
    # (A typed name that is no choice matches every weight set of that name.)
    runs = store.list_runs(
        algorithm=given(algorithm),
        verifier=name,
        prompt_set=given(prompt_set),
        backend=given(backend),
    )
    if not every_set:  # "name (fingerprint)": only that weight set
        runs = [r for r in runs if (r.verifier_fingerprint or None) == weights]
    return [f"{r.id}: {r.drafter} · {prompt_set_label(r.prompt_set)} · {r.status}" for r in runs]


def parse_ids(selected: list[str]) -> list[int]:
    return [int(s.split(":", 1)[0]) for s in selected or []]


# Digits that mean something, by unit: wall times vary by more than 0.1 s between runs, tau's
# bootstrap interval is about +-0.2, rates are counts over a few hundred drafts.  The CSV
# keeps every digit; this is the table only.
UNIT_DECIMALS = {"s": 1, "ms/token": 1, "tokens/s": 1, "tokens/step": 2, "x": 2, "fraction": 3}


def _missing(v: Any) -> bool:
    # pandas turns a missing value into NaN (numbers, and text columns too)
    return v is None or (isinstance(v, float) and not math.isfinite(v))


def _formatter(col: Column) -> Callable[[Any], str]:
    if col.key == "verifier_fingerprint":
        return lambda v: "" if _missing(v) else short_fingerprint(str(v))
    if col.key == "prompt_set":
        return lambda v: "" if _missing(v) else prompt_set_label(str(v))
    if col.kind == "text":
        return lambda v: "" if _missing(v) else str(v)
    decimals = 0 if col.kind == "int" else UNIT_DECIMALS.get(col.unit)

    def number(v: Any) -> str:
        if _missing(v):
            return ""
        if isinstance(v, str):
            return v
        if decimals is None:  # unitless (temperature): as typed, without trailing zeros
            return f"{v:g}"
        return f"{v:.{decimals}f}"

    return number


def header(col: Column) -> str:
    return f"{col.label} [{col.unit}]" if col.unit else col.label


def comparison_frame(c: Comparison) -> Styler:
    """Rows = runs; headers carry label and unit (definitions are in the legend).  Numbers
    keep their values (the table sorts by them) and show the digits in UNIT_DECIMALS."""
    cols = [col for col in c.columns if any(row.get(col.key) is not None for row in c.rows)]
    frame = pd.DataFrame({header(col): [row.get(col.key) for row in c.rows] for col in cols})
    return frame.style.format({header(col): _formatter(col) for col in cols}, na_rep="")


def definitions_markdown(c: Comparison) -> str:
    lines = [
        f"- **{col.label}** (`{col.key}`{', ' + col.unit if col.unit else ''}): {col.definition}"
        for col in c.columns
        if not col.key.startswith("acceptance_pos_") or col.key == "acceptance_pos_1"
    ]
    return "\n".join(lines)


def charts(c: Comparison) -> tuple[go.Figure, go.Figure, go.Figure, go.Figure]:
    """a_k curves, tau and speedup bars, the tokens-per-step histogram and the reliability
    diagram, all from the comparison (it read the steps once, in SQL)."""
    pos_keys = sorted(
        (col.key for col in c.columns if col.key.startswith("acceptance_pos_")),
        key=lambda k: int(k.rsplit("_", 1)[1]),
    )
    curves = go.Figure()
    bars = go.Figure()
    for row in c.rows:
        name = f"{row['run_id']}: {row.get('drafter')}"
        ys = [row.get(k) for k in pos_keys]
        if any(y is not None for y in ys):
            curves.add_trace(
                go.Scatter(x=list(range(1, len(ys) + 1)), y=ys, mode="lines+markers", name=name)
            )
        values = [row.get("acceptance_length"), row.get("speedup")]
        bounds = [
            (row.get(f"{k}_ci_low"), row.get(f"{k}_ci_high"))
            for k in ("acceptance_length", "speedup")
        ]
        # Whiskers: the 95% bootstrap interval over prompts, where the metrics have one.
        up = [
            hi - v if v is not None and hi is not None else None
            for v, (_, hi) in zip(values, bounds, strict=True)
        ]
        down = [
            v - lo if v is not None and lo is not None else None
            for v, (lo, _) in zip(values, bounds, strict=True)
        ]
        bars.add_trace(
            go.Bar(
                name=name,
                x=["τ", "speedup"],
                y=values,
                error_y={"type": "data", "symmetric": False, "array": up, "arrayminus": down},
            )
        )
    curves.update_layout(
        title="Per-position acceptance a_k",
        xaxis_title="slot k",
        yaxis_title="a_k",
        yaxis_range=[0, 1],
    )
    bars.update_layout(
        title="Acceptance length τ and speedup (whiskers: 95% interval over prompts)",
        barmode="group",
    )
    hist = go.Figure()
    for rid, counts in c.tokens_per_step.items():
        if counts:  # one bar per step length, its height the drafts of that length
            hist.add_trace(
                go.Bar(x=list(counts), y=list(counts.values()), name=str(rid), opacity=0.6)
            )
    hist.update_layout(
        title="Tokens per drafting step (1 + accepted)",
        barmode="overlay",
        xaxis_title="tokens",
        yaxis_title="steps",
    )
    rel = go.Figure()
    rel.add_trace(
        go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect", line={"dash": "dot"})
    )
    for rid, reliability in c.reliability.items():
        bins = [b for b in reliability if b.count]
        rel.add_trace(
            go.Scatter(
                x=[b.mean_confidence for b in bins],
                y=[b.accuracy for b in bins],
                mode="lines+markers",
                name=f"run {rid}",
            )
        )
    rel.update_layout(
        title="Confidence reliability (DSpark)",
        xaxis_title="predicted acceptance",
        yaxis_title="observed acceptance",
        xaxis_range=[0, 1],
        yaxis_range=[0, 1],
    )
    return curves, bars, hist, rel


def export_csv(c: Comparison) -> str:
    """Write the comparison's CSV under the data folder; the path the download serves."""
    out_dir = data_dir() / "exports"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkstemp(prefix="specui-compare-", suffix=".csv", dir=out_dir)[1])
    c.to_csv(path)
    return str(path)


def build(store: Store) -> None:
    gr.Markdown(
        "Select stored runs and compare them. Speedup is measured against the baseline run "
        "(no drafter) of the same prompt set, verifier (its weights too) and backend."
    )
    with gr.Row():
        algorithm = gr.Dropdown([ALL, *BUILTIN, *algorithm_names()], value=ALL, label="Algorithm")
        verifier = gr.Dropdown(
            [ALL, *verifier_choices(store)], value=ALL, label="Verifier", allow_custom_value=True
        )
        pset = gr.Dropdown(
            [ALL, "playground", *prompt_sets()],
            value=ALL,
            label="Prompt set",
            allow_custom_value=True,
        )
        backend = gr.Dropdown([ALL, "local", "vllm"], value=ALL, label="Backend")
        refresh = gr.Button("Refresh")
    runs = gr.CheckboxGroup(run_choices(store), label="Runs", elem_id="runs")
    with gr.Row():
        go_btn = gr.Button("Compare", variant="primary", elem_id="compare")
        csv_btn = gr.DownloadButton("Download CSV", elem_id="download-csv", interactive=False)
    table = gr.Dataframe(label="Comparison", elem_id="comparison", wrap=True, interactive=False)
    with gr.Accordion("Column definitions", open=False):
        defs = gr.Markdown()
    with gr.Row():
        curves = gr.Plot(label="Per-position acceptance")
        bars = gr.Plot(label="τ and speedup")
    with gr.Row():
        hist = gr.Plot(label="Acceptance length histogram")
        rel = gr.Plot(label="Reliability diagram")
    with gr.Accordion("Launch a benchmark (runs in the background)", open=False):
        with gr.Row():
            b_drafters = gr.Dropdown(
                [c for c in drafter_choices() if c != "none"], multiselect=True, label="Drafters"
            )
            b_prompts = gr.Dropdown(
                list(prompt_sets()), value="demo", label="Prompt set", allow_custom_value=True
            )
            b_limit = gr.Number(4, precision=0, label="Prompts (held-out split)")
            b_max = gr.Number(64, precision=0, label="Max new tokens")
            b_temp = gr.Number(0.0, label="Temperature")
        b_go = gr.Button("Start benchmark")
        b_status = gr.Markdown()

    def filt(a, v, p, b):
        return gr.update(choices=run_choices(store, a, v, p, b))

    def refresh_all(a, v, p, b):
        # New runs may bring a new verifier weight set: the verifier choices refresh too.
        return filt(a, v, p, b), gr.update(choices=[ALL, *verifier_choices(store)])

    for comp in (algorithm, verifier, pset, backend):
        comp.change(filt, [algorithm, verifier, pset, backend], runs)
    refresh.click(refresh_all, [algorithm, verifier, pset, backend], [runs, verifier])

    def do_compare(selected):
        ids = parse_ids(selected)
        if not ids:
            raise refuse("the Compare tab", "select at least one run")
        c = compare(store, ids)
        # The CSV is written from the table's comparison, so "Download CSV" serves what is shown.
        csv_path = export_csv(c)
        return (
            comparison_frame(c),
            definitions_markdown(c),
            *charts(c),
            gr.update(value=csv_path, interactive=True),
        )

    go_btn.click(
        do_compare, runs, [table, defs, curves, bars, hist, rel, csv_btn], api_visibility="private"
    )

    def start_bench(drafters, prompts, limit, max_new, temp, request: gr.Request):
        if not drafters:
            return "choose at least one drafter"
        try:  # the job runs in a worker: check what the visitor named here, in the app
            drafters, prompts = [ui_drafter(d) for d in drafters], ui_prompts(prompts)
        except SpecUIError as e:
            return f"❌ {e}"
        job = jobs.enqueue(
            store,
            "bench",
            {
                "drafters": drafters,
                "prompts": prompts,
                "limit": int(limit or 4),
                "max_new_tokens": int(max_new or 64),
                "temperature": float(temp or 0),
                "owner": request.session_hash if request else None,
            },
            owner=request.session_hash if request else None,
        )
        return f"benchmark queued as job {job.id}; its runs appear here when done (Refresh)"

    b_go.click(
        start_bench, [b_drafters, b_prompts, b_limit, b_max, b_temp], b_status, api_name="bench_job"
    )
