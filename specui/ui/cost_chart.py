"""The Playground's cost-model chart: what a verify of r rows costs on this machine and the
per-slot acceptance at which sending K = r - 1 drafts breaks even (``specui.policy``)."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specui.choices import ui_verifier
from specui.errors import SpecUIError
from specui.policy.choose import CurvePoint, cost_curve
from specui.policy.cost import known_cost_model
from specui.workbench import WORKBENCH


def cost_figure(points: list[CurvePoint]) -> go.Figure:
    """Verify ms by rows (left axis) and the break-even acceptance of K = rows - 1 (right)."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    rows = [p.rows for p in points]
    fig.add_trace(
        go.Scatter(
            x=rows,
            y=[p.verify_ms for p in points],
            mode="lines+markers",
            name="verify ms",
            customdata=[p.ratio for p in points],
            hovertemplate="%{x} rows: %{y:.2f} ms (%{customdata:.2f}x one row)<extra></extra>",
        ),
        secondary_y=False,
    )
    paying = [p for p in points if p.break_even is not None]
    fig.add_trace(
        go.Scatter(
            x=[p.rows for p in paying],
            y=[p.break_even for p in paying],
            mode="lines+markers",
            name="break-even acceptance",
            line={"dash": "dash"},
            hovertemplate="K=%{text}: pays above %{y:.2f} per slot<extra></extra>",
            text=[p.rows - 1 for p in paying],
        ),
        secondary_y=True,
    )
    fig.update_xaxes(title_text="rows verified (K drafts + 1)", dtick=1)
    fig.update_yaxes(title_text="verify ms", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="break-even acceptance", range=[0, 1], secondary_y=True)
    fig.update_layout(
        height=300, margin={"l": 50, "r": 50, "t": 30, "b": 40}, legend={"orientation": "h"}
    )
    return fig


def cost_view(verifier_choice: str) -> tuple[go.Figure | None, str]:
    """The chart and a line of text for the Playground's verifier; no chart while the verifier
    is not loaded or its cost model not measured yet (this never loads or measures)."""
    try:
        spec = ui_verifier(verifier_choice)
    except SpecUIError as e:
        return None, f"⚠️ {e}"
    if not WORKBENCH.verifier_ready(spec):
        return None, "The cost model appears once the verifier is loaded."
    cost = known_cost_model(WORKBENCH.verifier(spec))
    if cost is None or not cost.verify_s:
        return None, "Not measured yet: the first Generate with the adaptive policy measures it."
    never = [
        f"K={p.rows - 1}" for p in cost_curve(cost.verify_s) if p.rows > 1 and p.break_even is None
    ]
    key = cost.key
    text = (
        f"Measured on this machine ({key.get('precision', '?')}, {key.get('threads', '?')}"
        " threads). The adaptive policy sends a slot only where its calibrated acceptance"
        " estimate pays for its verify row"
        + (f"; {', '.join(never)} never pay here." if never else ".")
    )
    return cost_figure(cost_curve(cost.verify_s)), text
