"""A newcomer's first training: the README's command and the Train tab as it opens train on
the shipped corpus with its shipped responses (nothing generated), and every long stage
shows a progress bar with a rate and an ETA."""

from __future__ import annotations

import json
import random
import re
import shlex
from pathlib import Path

import pytest

from specui.cli import build_parser, main
from specui.commands.train import build_config
from specui.training.config import TrainConfig
from specui.training.progress import StageClock, format_duration, generation_plan

REPO = Path(__file__).resolve().parents[2]


def readme_train_argv() -> list[str]:
    """The README's training command, as a newcomer copies it (without the optional flags)."""
    lines = [
        ln for ln in (REPO / "README.md").read_text().splitlines() if ln.startswith("$S train ")
    ]
    assert len(lines) == 1, lines
    command = re.sub(r"\[[^]]*\]", "", lines[0].split("#", 1)[0])  # "[--resume]" is optional
    argv = shlex.split(command)
    assert argv[:2] == ["$S", "train"]
    return argv[1:]


def readme_config(*overrides: str) -> TrainConfig:
    return build_config(build_parser().parse_args([*readme_train_argv(), *overrides]))


# --- what a newcomer reads and clicks -----------------------------------------------------


def test_train_help_lists_the_registered_prompt_sets() -> None:
    from specui.data.prompts import PROMPT_SETS, prompt_sets, register_prompt_set

    register_prompt_set("newcomer-set", "registered by this test")(lambda split, limit: [])
    try:
        parser = build_parser()
        sub = next(
            a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)
        )
        train_parser = sub.choices["train"]
        help_text = train_parser._option_string_actions["--prompts"].help
        assert "newcomer-set" in "".join(train_parser.format_help().split())  # what --help prints
    finally:
        PROMPT_SETS.unregister("newcomer-set")
    trainable = [name for name, ps in prompt_sets().items() if not ps.evaluation_only]
    assert "general" in trainable
    for name in [*trainable, "newcomer-set"]:
        assert re.search(rf"[(, ]{re.escape(name)}[,;)]", help_text), name
    assert "default general" in help_text
    assert "spec-bench and its groups) are refused" in help_text


def test_the_train_tab_opens_on_the_readme_commands_data(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path / "data"))
    import gradio as gr

    from specui.store import Store
    from specui.ui import train as train_tab

    store = Store(tmp_path / "specui.db")
    with gr.Blocks() as demo:
        train_tab.build(store)
    by_label = {getattr(b, "label", None): b for b in demo.blocks.values()}
    prompts = by_label["Prompt set (train split)"]
    assert prompts.value == "general"
    offered = [value for _, value in prompts.choices]
    assert offered[0] == "general" and not any(name.startswith("spec-bench") for name in offered)

    # Start pressed on the tab as it opened: the job trains what the README command trains.
    fields = ["Algorithm", "Verifier", "Prompt set (train split)", "Steps", "Block size / K"]
    values = [by_label[f].value for f in fields]
    anchors = next(b for k, b in by_label.items() if k and k.startswith("Anchors per sequence"))
    layers, lr = by_label["Draft layers (0 = default)"].value, by_label["Learning rate"].value
    job_id = train_tab.start_training(store, *values, anchors.value, layers, lr, "first", None)
    tab = TrainConfig.from_dict(store.get_job(job_id).params)
    readme = readme_config()
    data = ("verifier", "prompts", "num_prompts", "max_new_tokens", "max_seq_len", "cache_dir")
    assert {k: getattr(tab, k) for k in data} == {k: getattr(readme, k) for k in data}
    # The shipped corpus at its shipped responses' cap.
    assert readme.prompts == "general" and readme.max_new_tokens == 128
    store.close()


# --- the estimate and the job's stage line -------------------------------------------------


def test_generation_plan_says_prompts_tokens_and_time_before_it_starts() -> None:
    assert (
        generation_plan(10114, 0, 128)
        == "self-distillation: all 10114 responses are cached, nothing to generate"
    )
    plan = generation_plan(10114, 10114, 256)
    assert "0 of 10114 responses cached; generating 10114" in plan
    assert "up to 256 new tokens each, 2,589,184 tokens at most" in plan
    assert "roughly 4.8 h at ~150 tokens/s" in plan
    assert [format_duration(s) for s in (0.4, 89, 600, 5400)] == ["0 s", "89 s", "10 min", "1.5 h"]


def test_stage_clock_reports_count_rate_and_eta_from_its_first_report() -> None:
    now = [100.0]
    clock = StageClock("generating responses", clock=lambda: now[0])
    assert clock.report(0, 100) == "generating responses 0/100"  # no rate before a batch
    now[0] += 5
    assert clock.report(10, 100) == "generating responses 10/100 · 2.0 prompts/s · ETA 45 s"
    steps = StageClock("training", clock=lambda: now[0])
    # Resumed at step 400: its own rate, not that of 400 steps in no time.
    assert steps.report(400, 2000, "step") == "step 400/2000"
    now[0] += 68
    assert steps.report(410, 2000, "step") == "step 410/2000 · 6.8 s/step · ETA 3.0 h"
    done = steps.report(2000, 2000, "step")
    assert done.startswith("step 2000/2000 · ") and "ETA" not in done


# --- the CLI's bars --------------------------------------------------------------------------


def test_every_long_stage_shows_a_bar_with_a_rate_and_an_eta(
    tmp_path: Path, fixture_dir: Path, capsys
) -> None:
    rng = random.Random(3)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt_ids": [rng.randrange(500) for _ in range(8)]}) + "\n"
            for _ in range(10)
        )
    )
    argv = ["train", "--algorithm", "dflash", "--verifier", str(fixture_dir / "verifier")]
    argv += ["--prompts", str(prompts), "--out", str(tmp_path / "o"), "--steps", "3"]
    argv += ["--max-new-tokens", "16", "--gen-batch-size", "2", "--aux-layers", "1,3,4"]
    argv += ["--extraction", "offline", "--threads", "1", "--warmup-steps", "1"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    plan = re.search(
        r"self-distillation: 0 of (\d+) responses cached; generating \1 "
        r"\(up to 16 new tokens each, ([\d,]+) tokens at most\): roughly",
        err,
    )
    assert plan, err
    todo = int(plan[1])
    assert todo > 1 and int(plan[2].replace(",", "")) == 16 * todo
    extracted = int(re.search(r"extracting hidden states of (\d+) of", err)[1])
    # Each bar from 0 (drawn before the first batch), ending with its rate and the ETA field.
    stages = [
        ("generating responses", "prompt", todo),
        ("extracting hidden states", "sample", extracted),
        ("training", "step", 3),
    ]
    for what, unit, total in stages:
        first = err.index(f"{what}:   0%")
        assert re.match(rf"{what}: +0%\|[^|]*\| 0/{total} \[", err[first:]), what
        # tqdm's [elapsed<remaining, rate]: the remaining time is the ETA.
        end = rf"{what}: 100%\|[^|]*\| {total}/{total} \[\d\d:\d\d<\d\d:\d\d, +[\d.]+"
        assert re.search(rf"{end}(?:{unit}s?/s|s/{unit})", err), what
    # The estimate comes first.
    assert err.index("roughly") < err.index("generating responses:   0%")


# --- the README's command on a fresh clone ------------------------------------------------


@pytest.mark.slow
def test_the_readme_training_command_generates_no_response(tmp_path: Path) -> None:
    from specui.training.hooks import TrainHooks
    from specui.training.loop import train

    # The command as written (every general training prompt, the default cap), a few small
    # steps: only the drafter's size and the step count differ, nothing that picks the data.
    small = ["--steps", "2", "--layers", "1", "--max-seq-len", "256"]
    cfg = readme_config(
        "--out", str(tmp_path / "my-dflash"), *small, "--threads", "1", "--log-every", "1"
    )
    generation: list[tuple[int, int]] = []

    def stage(what: str, done: int, total: int) -> None:
        if what == "generating responses":
            generation.append((done, total))
            # Reported before the first batch: stop there, not after hours of generation.
            assert total == 0, f"the README's command would generate {total} responses"

    said: list[str] = []
    result = train(cfg, TrainHooks(stage=stage, log=said.append))
    assert result.status == "finished" and result.step == 2
    assert generation == [(0, 0)]  # the lookup reported, and no batch followed
    assert "self-distillation: all 10114 responses are cached, nothing to generate" in said
    assert not list((tmp_path / "my-dflash" / "cache").glob("responses-*"))  # nothing written
