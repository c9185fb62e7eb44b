"""Speculators tab: list with model cards, import a folder, validate against a
verifier, and the exact ``vllm serve`` line to serve one."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
from pathlib import Path

import gradio as gr

from specui.algorithms.checkpoint import validate_checkpoint
from specui.algorithms.resolve import shipped_drafters
from specui.choices import ui_prompts, ui_verifier
from specui.errors import SpecUIError
from specui.export import vllm_serve_command
from specui.paths import confine
from specui.ui.refusals import refuse
from specui.workbench import WORKBENCH, trained_drafters_dir

ALLOWED_UPLOADS = {"config.json", "model.safetensors", "README.md"}
# Weights that unpickle (run code) when loaded: refused by name, never opened.
PICKLE_WEIGHTS = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def max_upload_bytes() -> int:
    """The upload cap (``SPECUI_MAX_UPLOAD_MB``, default 512); app.py gives Gradio the same."""
    return int(float(os.environ.get("SPECUI_MAX_UPLOAD_MB", "512")) * 2**20)


def speculator_folders() -> dict[str, Path]:
    out = {f"shipped/{k}": v for k, v in shipped_drafters().items()}
    root = trained_drafters_dir()
    if root.is_dir():
        out.update(
            {
                f"trained/{p.name}": p
                for p in sorted(root.iterdir())
                if (p / "config.json").is_file()
            }
        )
    return out


def describe(folder: Path) -> str:
    """Model card (README.md) or a summary of config.json."""
    card = folder / "README.md"
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        return f"⚠️ config.json unreadable: {e}"
    k = (cfg.get("speculators_config", {}).get("proposal_methods") or [{}])[0].get(
        "speculative_tokens"
    )
    layer = cfg.get("transformer_layer_config", {})
    head = (
        f"**{folder.name}** · `{cfg.get('speculators_model_type')}` · K={k} ·"
        f" {layer.get('num_hidden_layers')} layer(s) · aux layers"
        f" {cfg.get('aux_hidden_state_layer_ids') or cfg.get('eagle_aux_hidden_state_layer_ids')} "
        f" \n`{folder}`\n\n"
    )
    return head + (card.read_text()[:20_000] if card.is_file() else "_no model card_")


def validate(folder: Path, verifier_choice: str) -> str:
    problems = validate_checkpoint(folder, WORKBENCH.verifier(ui_verifier(verifier_choice)))
    if not problems:
        return f"✅ `{folder.name}` fits verifier `{verifier_choice}`"
    return "❌ does not fit:\n" + "\n".join(f"- {p}" for p in problems)


def run_doctor(folder: Path, verifier_choice: str, prompts: str | None) -> str:
    """The doctor's report on ``folder`` as HTML (the CLI's ``specui doctor``), stored with it."""
    from specui.doctor import DoctorOptions, diagnose, save_report, to_html

    spec = ui_verifier(verifier_choice)
    opts = DoctorOptions(prompts=ui_prompts(prompts) if (prompts or "").strip() else None)
    report = diagnose(folder, WORKBENCH.verifier(spec), spec, opts)
    save_report(report)
    return to_html(report)


def import_folder(source: str | None, uploads: list[str] | None, name: str) -> Path:
    """Copy a speculators folder (a path inside the app's folders, or uploaded files)
    into the app's speculators folder under ``name``."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name or ""):
        raise SpecUIError(
            "name: letters, digits, '.', '_' and '-' (up to 64), starting with a letter or digit"
        )
    dest = trained_drafters_dir() / name
    if dest.exists():
        raise SpecUIError(f"a speculator named {name!r} already exists")
    files: dict[str, Path] = {}
    if source:
        src = confine(source)
        if not src.is_dir():
            raise SpecUIError(f"{source} is not a folder")
        files = {f.name: f for f in src.iterdir() if f.name in ALLOWED_UPLOADS}
        pickled = sorted(f.name for f in src.iterdir() if f.suffix in PICKLE_WEIGHTS)
        if pickled and "model.safetensors" not in files:
            raise SpecUIError(
                f"{source} holds pickle weights ({', '.join(pickled)}), which SpecUI never loads "
                "(unpickling runs code): convert them to model.safetensors"
            )
    for up in uploads or []:
        p = Path(up)
        if p.name not in ALLOWED_UPLOADS:
            raise SpecUIError(
                f"unexpected file {p.name}: upload config.json, model.safetensors (and README.md)"
            )
        if p.stat().st_size > max_upload_bytes():
            raise SpecUIError(f"{p.name} is larger than {max_upload_bytes() // 2**20} MiB")
        files[p.name] = p
    if not {"config.json", "model.safetensors"} <= files.keys():
        raise SpecUIError("a speculator needs config.json and model.safetensors")
    tmp = dest.with_name(f".{name}.importing")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for fname, f in files.items():
        shutil.copyfile(f, tmp / fname)
    tmp.rename(dest)
    return dest


def build() -> None:
    folders = speculator_folders()
    with gr.Row():
        with gr.Column(scale=1):
            pick = gr.Dropdown(
                list(folders),
                value=next(iter(folders), None),
                label="Speculator",
                elem_id="speculator",
            )
            verifier = gr.Dropdown(
                ["embedded"], value="embedded", label="Verifier", allow_custom_value=True
            )
            with gr.Row():
                val_btn = gr.Button("Validate against verifier")
                vllm_btn = gr.Button("vLLM serve command")
            report = gr.Markdown()
            cmd = gr.Code(label="Serve with vLLM", language="shell")
            with gr.Accordion("Doctor: why is acceptance low?", open=False, elem_id="doctor"):
                doc_folder = gr.Textbox(
                    label="Folder to examine (blank: the speculator above)", elem_id="doctor-folder"
                )
                doc_prompts = gr.Textbox(
                    value="",
                    label="Prompt set (blank: the model card's, else spec-bench:qa)",
                    elem_id="doctor-prompts",
                )
                doc_btn = gr.Button("Run doctor", elem_id="doctor-run")
                doc_report = gr.HTML(elem_id="doctor-report")
            with gr.Accordion("Import a speculator", open=False):
                src = gr.Textbox(label="Folder (inside the app's data folders)")
                up = gr.File(
                    file_count="multiple",
                    file_types=[".json", ".safetensors", ".md"],
                    label="or upload files",
                )
                name = gr.Textbox(label="Name")
                imp_btn = gr.Button("Import")
                imp_status = gr.Markdown()
        with gr.Column(scale=2):
            card = gr.Markdown(
                describe(folders[pick.value]) if pick.value else "no speculators yet"
            )

    def current(key):
        folder = speculator_folders().get(key)
        if folder is None:
            raise refuse("the Speculators tab", "choose a speculator")
        return folder

    pick.change(lambda key: describe(current(key)), pick, card)

    def on_validate(key, v):
        try:
            return validate(current(key), v)
        except SpecUIError as e:
            return f"❌ {e}"

    val_btn.click(on_validate, [pick, verifier], report, api_name="validate")
    vllm_btn.click(
        lambda key, v: vllm_serve_command(current(key), v),
        [pick, verifier],
        cmd,
        api_name="vllm_command",
    )

    def on_doctor(key, folder, v, prompts):
        try:
            return run_doctor(
                current(key) if not (folder or "").strip() else confine(folder.strip()), v, prompts
            )
        except SpecUIError as e:
            return f"<p>❌ {html.escape(str(e))}</p>"

    doc_btn.click(
        on_doctor, [pick, doc_folder, verifier, doc_prompts], doc_report, api_name="doctor"
    )

    def on_import(source, uploads, name_):
        try:
            dest = import_folder(source, uploads, name_.strip())
        except SpecUIError as e:
            return f"❌ {e}", gr.update()
        return f"✅ imported as `trained/{dest.name}`", gr.update(
            choices=list(speculator_folders())
        )

    imp_btn.click(on_import, [src, up, name], [imp_status, pick])
