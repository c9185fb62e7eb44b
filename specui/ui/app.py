"""The dashboard: one Gradio Blocks app over the library (engine, drafters, store, workers).

Every event handler is a few lines calling the library, so each action also
works from the CLI and from tests without a browser.
"""

from __future__ import annotations

import os

import gradio as gr

from specui.store import Store
from specui.ui import api, compare, playground, render, speculators, train, vllm_tab
from specui.ui.train_view import PlaygroundTarget

TITLE = "SpecUI — parallel speculative decoding workbench"


def build_app(store: Store, queue_size: int | None = None) -> gr.Blocks:
    """The dashboard over ``store``; at most ``queue_size`` requests wait (default SPECUI_QUEUE_SIZE
    or 16)."""
    if queue_size is None:
        queue_size = int(os.environ.get("SPECUI_QUEUE_SIZE", "16"))
    if queue_size < 1:
        raise ValueError(f"the queue size must be at least 1, got {queue_size}")
    with gr.Blocks(title=TITLE) as app:
        gr.Markdown(
            f"# {TITLE}\nP-EAGLE · DFlash · DSpark, with EAGLE-3 and plain / n-gram decoding as"
            " baselines."
        )
        with gr.Tabs() as tabs:
            with gr.Tab("Playground", id="playground"):
                speculator, status = playground.build(store)
            with gr.Tab("Train", id="train"):
                # The Train tab's Open button sets the Playground's speculator and shows it.
                train.build(store, PlaygroundTarget(tabs, speculator, status, "playground"))
            with gr.Tab("Compare", id="compare"):
                compare.build(store)
            with gr.Tab("Speculators", id="speculators"):
                speculators.build()
            with gr.Tab("vLLM", id="vllm"):
                vllm_tab.build(store)
        api.register(store)
    # Several visitors share one CPU: a bounded queue says "busy" instead of piling up.
    app.queue(max_size=queue_size, default_concurrency_limit=2)
    return app


CSS = render.CSS
