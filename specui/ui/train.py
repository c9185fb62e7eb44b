"""Train tab: start a training job in a background worker, watch progress, loss, per-position
accuracy and the held-out acceptance preview, read the log tail, cancel or resume, open the
newest checkpoint in the Playground; the training campaign's curves (``train_view``)."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Mapping
from typing import Any

import gradio as gr

from specui.algorithms.spec import algorithm, algorithm_names, labels, train_defaults, train_knobs
from specui.choices import ui_prompts, ui_verifier
from specui.data import training_prompt_sets
from specui.errors import SpecUIError
from specui.jobs import queue as jobs
from specui.store import Job, JobStatus, Store, admin_mode, check_owner
from specui.training.config import DEFAULT_PROMPTS, TrainConfig
from specui.ui.train_view import PlaygroundTarget, build_campaign, job_view, wire_open_button
from specui.workbench import trained_drafters_dir


def algorithm_choices() -> list[str]:
    """The Algorithm dropdown: every trainable algorithm in the registry, in list order."""
    return algorithm_names(trainable=True)


def prompt_choices() -> list[str]:
    """The Prompt set dropdown: the registered sets a drafter may train on (evaluation sets
    are refused by training, so they are not offered), the default first."""
    return sorted(training_prompt_sets(), key=lambda name: name != DEFAULT_PROMPTS)


# The two algorithm options the tab has shown from the start, among the /train API's first
# inputs; every other one (train_knobs: each algorithm's options.py) is generated after them.
LEADING_KNOBS = ("block_size", "max_anchors")


def option_widgets() -> dict[str, Any]:
    """A widget per training option of the registered algorithms, beyond LEADING_KNOBS, by name:
    its default, its help and the algorithms that read it as the label."""
    widgets: dict[str, Any] = {}
    for name, f in train_knobs().items():
        if name in LEADING_KNOBS:
            continue
        help_text = f.metadata["help"]
        kw = {
            "label": f"{help_text[:1].upper()}{help_text[1:]} ({labels(name)})",
            "elem_id": f"train-option-{name}",
        }
        if isinstance(f.default, bool):
            widgets[name] = gr.Checkbox(f.default, **kw)
        else:
            precision = 0 if isinstance(f.default, int) else None
            widgets[name] = gr.Number(f.default, precision=precision, **kw)
    return widgets


def shown_options(name: str, widgets: list[str]) -> list[dict[str, Any]]:
    """What each option widget in ``widgets`` (option names) shows when algorithm ``name`` is
    picked: visible where the algorithm reads the option, at the algorithm's own default (so a
    value set for another algorithm is not sent with this one's job)."""
    reads, defaults = set(algorithm(name).train_fields), train_defaults(name)
    return [{"visible": w in reads, "value": defaults[w]} for w in widgets]


def setting_widgets() -> dict[str, Any]:
    """A widget per shared training setting (TrainConfig's fields) the tab does not show by
    hand (``tab=False``: those, and the server's paths), by name: its default, its help."""
    widgets: dict[str, Any] = {}
    for f in TrainConfig.settings():
        if not f.metadata.get("tab", True):
            continue
        help_text = f.metadata["help"]
        kw = {
            "label": f"{help_text[:1].upper()}{help_text[1:]}",
            "elem_id": f"train-setting-{f.name}",
        }
        kind, choices = TrainConfig.setting_type(f), f.metadata.get("choices")
        if kind is bool:
            widgets[f.name] = gr.Checkbox(f.default, **kw)
        elif choices:
            widgets[f.name] = gr.Dropdown(list(choices), value=f.default, **kw)
        elif kind in (int, float) and f.default is None:
            # An optional number (unset: the run decides): gr.Number shows None as empty but
            # sends 0 once the accordion is drawn, which would reach the job as a setting of 0
            # (draft vocab 0: a failed job); a textbox sends its empty value as unset.
            widgets[f.name] = gr.Textbox("", placeholder="default", **kw)
        elif kind in (int, float):
            widgets[f.name] = gr.Number(f.default, precision=0 if kind is int else None, **kw)
        else:
            widgets[f.name] = gr.Textbox(f.default or "", **kw)
    return widgets


def _setting_value(name: str, value: Any) -> Any:
    """A setting widget's value as its field's type (None: left unset)."""
    f = next(f for f in TrainConfig.settings() if f.name == name)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    kind = TrainConfig.setting_type(f)
    if kind not in (int, float, str, bool):
        return value
    try:
        return kind(value.strip() if isinstance(value, str) else value)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise SpecUIError(f"{name.replace('_', ' ')} must be {what}, got {value!r}") from None


# Where the verifier's hidden states come from (TrainConfig.extractor): (label, value).
EXTRACTORS = [
    ("local (the training process)", "local"),
    ("vLLM (a server started and stopped by the job)", "vllm"),
]


def job_choices(store: Store) -> list[str]:
    return [
        f"{j.id}: {j.kind} · {j.status} · {j.params.get('algorithm', '')}"
        f" {j.params.get('out', '').rsplit('/', 1)[-1]}"
        for j in store.list_jobs(limit=50)
    ]


def start_training(
    store: Store,
    algorithm: str,
    verifier: str,
    prompts: str,
    steps: int,
    block_size: int,
    max_anchors: int,
    layers: int,
    lr: float,
    name: str,
    owner: str | None,
    extractor: str = "local",
    options: Mapping[str, Any] | None = None,
) -> int:
    """Queue a train job; ``options``: more algorithm options and shared settings by name
    (option_widgets' and setting_widgets'), those at their default left out of the job's
    params."""
    if algorithm not in algorithm_choices():
        raise SpecUIError(f"unknown algorithm {algorithm!r}")
    name = name.strip() or f"{algorithm}-{time.strftime('%Y%m%d-%H%M%S')}"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
        raise SpecUIError("name: letters, digits, '.', '_' and '-' (up to 64)")
    if int(steps) < 1:
        raise SpecUIError("steps must be >= 1")
    verifier, prompts = ui_verifier(verifier), ui_prompts(prompts)  # paths: the app's folders only
    out = trained_drafters_dir() / name
    # A job resumes whatever its folder holds: a new one must not write into another's speculator.
    busy = {
        j.params.get("out")
        for j in store.list_jobs(limit=500)
        if j.status in (JobStatus.QUEUED, JobStatus.RUNNING)
    }
    if out.exists() or str(out) in busy:
        raise SpecUIError(
            f"a speculator named {name!r} already exists or is being trained; choose another name"
        )
    params = {
        "algorithm": algorithm,
        "verifier": verifier,
        "prompts": prompts,
        "steps": int(steps),
        "block_size": int(block_size),
        "max_anchors": int(max_anchors),
        "lr": float(lr),
        "out": str(out),
        "threads": 1,
    }
    if layers:
        params["layers"] = int(layers)
    if extractor != "local":
        params["extractor"] = extractor
    knobs, defaults = train_knobs(), train_defaults(algorithm)
    settings = {f.name: f for f in TrainConfig.settings() if f.metadata.get("tab", True)}
    for key, value in (options or {}).items():
        if key in settings:
            value = _setting_value(key, value)
            if value is not None and value != settings[key].default:
                params[key] = value
            continue
        if key not in knobs:
            raise SpecUIError(f"unknown training option {key!r}")
        value = type(knobs[key].default)(value)  # a Number widget's float for an int option
        if value != defaults[key]:
            params[key] = value
    # Every option checked now (an unknown extractor, vLLM not installed), in the button's
    # message, rather than in a job that fails after minutes of self-distillation.
    TrainConfig.from_dict(params)
    return jobs.enqueue(store, "train", params, owner=owner).id


def resume_training(store: Store, job_id: int, requester: str | None) -> Job:
    """Queue a cancelled or failed job again (it continues from its last checkpoint);
    only its owner may, unless the operator enabled admin mode."""
    old = store.get_job(job_id)
    check_owner("job", old.id, old.owner, requester, admin_mode())
    if old.status not in (JobStatus.CANCELLED, JobStatus.FAILED):
        raise SpecUIError(
            f"job {old.id} is {old.status}; only a cancelled or failed job is resumed"
        )
    return jobs.enqueue(store, old.kind, {**old.params, "resume": True}, owner=requester)


def build(store: Store, playground: PlaygroundTarget | None = None) -> None:
    """The tab's components and events; ``playground``: where the Open button sends a job's
    newest speculator (None: the tab built alone, the button only says which)."""
    with gr.Row():
        with gr.Column(scale=1):
            choices = algorithm_choices()
            algorithm = gr.Dropdown(
                choices, value=choices[0], label="Algorithm", elem_id="train-algorithm"
            )
            verifier = gr.Dropdown(
                ["embedded"], value="embedded", label="Verifier", allow_custom_value=True
            )
            # The shipped drafters' corpus: its responses ship too, so a job trains at once.
            prompts = gr.Dropdown(
                prompt_choices(),
                value=DEFAULT_PROMPTS,
                label="Prompt set (train split)",
                allow_custom_value=True,
                elem_id="train-prompts",
            )
            shared = {f.name: f.default for f in dataclasses.fields(TrainConfig)}  # one place
            steps = gr.Number(shared["steps"], precision=0, label="Steps", elem_id="train-steps")
            knobs = train_knobs()
            block = gr.Number(knobs["block_size"].default, precision=0, label="Block size / K")
            anchors = gr.Number(
                knobs["max_anchors"].default,
                precision=0,
                label=f"Anchors per sequence ({labels('max_anchors')})",
                elem_id="train-option-max_anchors",
            )
            layers = gr.Number(0, precision=0, label="Draft layers (0 = default)")
            lr = gr.Number(shared["lr"], label="Learning rate")
            extractor = gr.Dropdown(
                EXTRACTORS,
                value="local",
                label="Hidden states from",
                elem_id="train-extractor",
                info=(
                    "vLLM: extracted by a vLLM server (.venv-vllm) before training, which it then"
                    " stops"
                ),
            )
            with gr.Accordion("More algorithm options", open=False):
                options = option_widgets()
            with gr.Accordion("More training settings", open=False):
                settings = setting_widgets()
            name = gr.Textbox(label="Name (the speculator's folder)", elem_id="train-name")
            start = gr.Button("Start training", variant="primary", elem_id="train-start")
            started = gr.Markdown(elem_id="train-started")
        with gr.Column(scale=2):
            with gr.Row():
                pick = gr.Dropdown(job_choices(store), label="Job", elem_id="job")
                refresh = gr.Button("Refresh")
                cancel = gr.Button("Cancel", variant="stop", elem_id="job-cancel")
                resume = gr.Button("Resume", elem_id="job-resume")
            head = gr.Markdown(elem_id="job-status")
            with gr.Row():
                loss = gr.Plot()
                acc = gr.Plot()
                held = gr.Plot(elem_id="job-heldout-plot")
            held_note = gr.Markdown(elem_id="job-heldout")
            with gr.Row():
                open_ckpt = gr.Button(
                    "Open latest checkpoint in Playground", elem_id="job-open-checkpoint"
                )
                opened = gr.Markdown(elem_id="job-open-status")
            log = gr.Textbox(label="Log tail", lines=10, max_lines=20, autoscroll=True)
            build_campaign()
    timer = gr.Timer(2.0)

    generated = {**options, **settings}  # the /train API's inputs after the hand-wired ones

    # The request first: gradio passes it only among the positional parameters, before *values.
    def on_start(request: gr.Request, a, v, p, s, b, an, ly, lr_, n, ex, *values):
        try:
            owner = request.session_hash if request else None
            jid = start_training(
                store,
                a,
                v,
                p,
                s,
                b,
                an,
                ly,
                lr_,
                n,
                owner,
                ex or "local",
                dict(zip(generated, values, strict=True)),
            )
        except SpecUIError as e:
            return f"❌ {e}", gr.update()
        choices = job_choices(store)
        return f"job {jid} queued", gr.update(
            choices=choices, value=next(c for c in choices if c.startswith(f"{jid}:"))
        )

    # Only the picked algorithm's options show (the anchors too: DFlash and DSpark read them).
    shown = ["max_anchors", *options]
    for widget, update in zip(
        [anchors, *options.values()], shown_options(choices[0], shown), strict=True
    ):
        widget.visible = update["visible"]
    algorithm.change(
        lambda a: [gr.update(**u) for u in shown_options(a, shown)],
        algorithm,
        [anchors, *options.values()],
    )

    # The extractor, the generated options and settings last: /train callers that pass the first
    # nine inputs keep working.
    inputs = [algorithm, verifier, prompts, steps, block, anchors, layers, lr, name, extractor]
    start.click(on_start, [*inputs, *generated.values()], [started, pick], api_name="train")
    refresh.click(lambda: gr.update(choices=job_choices(store)), None, pick)
    view = [head, loss, acc, held, held_note, log]
    pick.change(lambda c: job_view(store, c), pick, view)
    timer.tick(lambda c: job_view(store, c), pick, view)
    wire_open_button(store, open_ckpt, pick, opened, playground)

    def on_cancel(choice, request: gr.Request):
        if not choice:
            return "no job selected"
        try:
            jobs.cancel(
                store,
                int(choice.split(":", 1)[0]),
                request.session_hash if request else None,
                force=admin_mode(),
            )
        except SpecUIError as e:
            return f"❌ {e}"
        return "cancel requested"

    cancel.click(on_cancel, pick, head)

    def on_resume(choice, request: gr.Request):
        if not choice:
            return "no job selected", gr.update()
        try:
            job = resume_training(
                store, int(choice.split(":", 1)[0]), request.session_hash if request else None
            )
        except SpecUIError as e:
            return f"❌ {e}", gr.update()
        return f"resuming as job {job.id} from the last checkpoint", gr.update(
            choices=job_choices(store)
        )

    resume.click(on_resume, pick, [head, pick])
