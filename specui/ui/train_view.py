"""The Train tab's views of a run: a job's curves with the held-out acceptance preview, opening
its newest speculator in the Playground, and the training campaign's stages (read-only)."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import plotly.colors
import plotly.graph_objects as go

from specui.choices import ui_drafter
from specui.errors import SpecUIError
from specui.jobs.training import output_folder
from specui.paths import campaign_dir
from specui.store import Store
from specui.training.curves import (
    HELDOUT_ACCEPT,
    PREFIX,
    CurveGroups,
    campaign_stage,
    campaign_stages,
    eval_every_of,
    group_curves,
    heldout_note,
    latest_speculator,
    read_metrics,
    run_summary,
    series_from_points,
)
from specui.workbench import drafter_choices


def _trace(name: str, points, **style) -> go.Scatter:
    xs, ys = zip(*points, strict=True)
    return go.Scatter(
        x=xs, y=ys, mode="lines+markers" if len(xs) < 3 else "lines", name=name, **style
    )


# A third of the tab's width each: short titles, the legend under the plot, thin margins.
_LAYOUT = {
    "xaxis_title": "step",
    "margin": {"l": 40, "r": 10, "t": 60, "b": 40},
    "legend": {"orientation": "h", "yanchor": "top", "y": -0.35, "font": {"size": 10}},
    "height": 420,
}


def _title(text: str, sub: str) -> dict:
    return {"text": text, "subtitle": {"text": sub}}


def _colour(position: int) -> str:
    palette = plotly.colors.qualitative.Plotly
    return palette[(position - 1) % len(palette)]


def waiting_text(eval_every: int) -> str:
    """What the empty held-out plot says: when its first point comes, or that none will."""
    if eval_every <= 0:
        return "held-out evaluation off<br>(eval every: 0 steps)"
    return f"no held-out evaluation yet<br>(every {eval_every} steps)"


def curve_figures(groups: CurveGroups, eval_every: int) -> tuple[go.Figure, go.Figure, go.Figure]:
    """Loss, per-position accuracy and the held-out acceptance preview; held-out series dashed
    beside the training batch's; the preview says when its first point comes while it has none."""
    loss, acc, held = go.Figure(), go.Figure(), go.Figure()
    for name, points in groups.loss.items():
        loss.add_trace(
            _trace(name, points, line={"dash": "dash" if name.startswith(PREFIX) else None})
        )
    # A position's two lines share a colour and a legend entry: 2 x 7 entries would crowd out
    # a third of the tab's width.
    for name, points in groups.accuracy.items():
        position = name.rsplit("_", 1)[1]
        heldout = name.startswith(PREFIX)
        twin = name.removeprefix(PREFIX) in groups.accuracy
        acc.add_trace(
            _trace(
                name,
                points,
                line={"dash": "dash" if heldout else None, "color": _colour(int(position))},
                legendgroup=position,
                showlegend=not (heldout and twin),
            )
        )
    for name, points in groups.acceptance.items():
        # The held-out lines lead; the training batch's (the data it just fit) for reference.
        if name.startswith(PREFIX):
            width = 3 if name == HELDOUT_ACCEPT else 1.5
            held.add_trace(_trace(name, points, line={"width": width}))
        else:
            held.add_trace(_trace(name, points, line={"dash": "dot", "width": 1}, opacity=0.5))
    if not groups.last_heldout():
        held.add_annotation(
            text=waiting_text(eval_every),
            showarrow=False,
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
        )
    loss.update_layout(title=_title("Loss", "held-out dashed"), **_LAYOUT)
    acc.update_layout(
        title=_title("Per-position accuracy", "held-out dashed"), yaxis_range=[0, 1], **_LAYOUT
    )
    held.update_layout(
        title=_title("Held-out acceptance preview", "expected tokens per step"), **_LAYOUT
    )
    values = [v for points in groups.acceptance.values() for _, v in points]
    if values and max(values) - min(values) < 0.2:
        # A flat start (1.0000001 vs 1.0) is not drawn as a climb: a tenth of a token each side.
        held.update_yaxes(range=[min(values) - 0.1, max(values) + 0.1])
    return loss, acc, held


def job_view(store: Store, choice: str | None):
    """The selected job: its header, its three plots, the held-out line and its log tail."""
    if not choice:
        return "no job selected", go.Figure(), go.Figure(), go.Figure(), "", ""
    job = store.get_job(int(choice.split(":", 1)[0]))
    pct = f"{100 * (job.progress or 0):.0f}%"
    head = f"**job {job.id}** · {job.kind} · **{job.status}** · {pct} · {job.message or ''}"
    if job.error:
        head += f"  \n⚠️ {job.error}"
    groups = group_curves(
        series_from_points((m.step, m.name, m.value) for m in store.job_metrics(job.id))
    )
    every = int(job.params.get("eval_every") or 0)
    note = heldout_note(groups, every) if job.kind == "train" else ""
    return head, *curve_figures(groups, every), note, job.log_tail or ""


def open_job_speculator(store: Store, choice: str | None) -> tuple[str, str]:
    """The newest speculator the selected train job saved, as the Playground's speculator
    choice (a path inside the app's folders: ``ui_drafter``'s rule) and a line saying what it
    is; a SpecUIError saying why there is none."""
    if not choice:
        raise SpecUIError("no job selected")
    job = store.get_job(int(choice.split(":", 1)[0]))
    if job.kind != "train":
        raise SpecUIError(f"job {job.id} is a {job.kind} job; only a train job saves speculators")
    saved = latest_speculator(output_folder(job, store.jobs_dir))
    if saved is None:
        every = job.params.get("checkpoint_every", "N")
        raise SpecUIError(
            f"job {job.id} has saved no checkpoint yet (one every {every} steps, and when it"
            " ends or is cancelled)"
        )
    path = ui_drafter(str(saved.path))  # the Playground loads only what this allows
    what = "final drafter" if saved.final else "checkpoint"
    return path, f"job {job.id}'s {what} (step {saved.step}): `{path}`"


def open_in_playground(store: Store, choice: str | None) -> tuple[str, str | None]:
    """(status line, speculator choice or None) for the Open button."""
    try:
        path, what = open_job_speculator(store, choice)
    except SpecUIError as e:
        return f"❌ {e}", None
    return f"the Playground's speculator is now {what}", path


@dataclass
class PlaygroundTarget:
    """What the Open button sets: the tabs (to switch to the Playground), its speculator and its
    status line."""

    tabs: gr.Tabs
    speculator: gr.Dropdown
    status: gr.Markdown
    tab_id: str = "playground"


def wire_open_button(
    store: Store,
    button: gr.Button,
    pick: gr.Dropdown,
    line: gr.Markdown,
    target: PlaygroundTarget | None,
) -> None:
    """The Open button: the selected job's newest speculator becomes the Playground's choice and
    the Playground tab opens, its status line saying what was set; without a ``target`` (the tab
    built alone) only ``line`` says."""
    if target is None:
        button.click(
            lambda c: open_in_playground(store, c)[0], pick, line, api_visibility="private"
        )
        return

    def on_open(choice):
        said, path = open_in_playground(store, choice)
        if path is None:
            return said, gr.update(), gr.update(), gr.update()
        names = drafter_choices()
        return (
            said,
            gr.Tabs(selected=target.tab_id),
            gr.update(choices=names if path in names else [*names, path], value=path),
            said,
        )

    # UI conveniences over library calls (specui.training.curves): no API endpoints of their own.
    button.click(
        on_open,
        pick,
        [line, target.tabs, target.speculator, target.status],
        api_visibility="private",
    )


def campaign_view(stage: str | None):
    """A campaign stage's header, plots and held-out line (only a listed stage name is read)."""
    empty = (go.Figure(), go.Figure(), go.Figure(), "")
    if not stage:
        return campaign_note(), *empty
    try:
        run = campaign_stage(stage)
    except SpecUIError as e:
        return f"❌ {e}", *empty
    groups, every = group_curves(read_metrics(run)), eval_every_of(run)
    note = heldout_note(groups, every)
    return f"**{stage}** · {run_summary(run, groups)}", *curve_figures(groups, every), note


def campaign_note() -> str:
    """What the accordion says before a stage is picked (the folder itself is not named: it is
    the server's)."""
    if not campaign_dir().is_dir():
        return (
            "no training campaign on this server (its folder, SPECUI_CAMPAIGN_DIR, does not exist)"
        )
    stages = campaign_stages()
    if not stages:
        return "the training campaign has no stage with metrics yet"
    return f"{len(stages)} campaign stage(s) with metrics: pick one"


def build_campaign() -> None:
    """The Campaign accordion: a stage of the campaign (``specui.training.campaign_train``) and its
    curves, read from the operator's campaign folder."""
    with gr.Accordion("Campaign (read-only)", open=False, elem_id="campaign"):
        with gr.Row():
            stage = gr.Dropdown(
                list(campaign_stages()),
                value=None,
                label="Campaign stage",
                elem_id="campaign-stage",
            )
            refresh = gr.Button("↻", scale=0, min_width=40, elem_id="campaign-refresh")
        head = gr.Markdown(campaign_note(), elem_id="campaign-status")
        with gr.Row():
            loss, acc, held = gr.Plot(), gr.Plot(), gr.Plot(elem_id="campaign-heldout-plot")
        note = gr.Markdown(elem_id="campaign-heldout")
    outputs = [head, loss, acc, held, note]
    stage.change(campaign_view, stage, outputs, api_visibility="private")

    def on_refresh(current):
        names = list(campaign_stages())
        keep = current if current in names else None
        return gr.update(choices=names, value=keep), *campaign_view(keep)

    refresh.click(on_refresh, stage, [stage, *outputs], api_visibility="private")
