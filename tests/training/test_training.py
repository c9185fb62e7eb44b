"""``specui train`` end to end on the tiny fixture verifier (and once on SmolLM2).

The fixture verifier has no tokenizer, so prompts are token-id JSONL rows; the
verifier writes the responses (self-distillation) exactly as for a real model.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specui.algorithms.checkpoint import load_drafter, load_model, validate_checkpoint
from specui.algorithms.dspark.options import DSparkOptions
from specui.cli import main
from specui.errors import SpecUIError
from specui.training.config import TrainConfig
from specui.training.hooks import TrainHooks
from specui.training.loop import train
from specui.training.state import latest_checkpoint, list_checkpoints
from tests.support.paths import REPO

AUX = "1,3,4"  # the fixture verifier has 6 layers; these are the fixtures' own aux layers


@pytest.fixture(scope="module")
def data(tmp_path_factory, fixture_dir):
    """A token-id prompt file and a response/hidden-state cache shared by this module's runs."""
    root = tmp_path_factory.mktemp("train-data")
    rng = random.Random(0)
    with open(root / "prompts.jsonl", "w") as f:
        for i in range(16):
            ids = [
                rng.randrange(0, 500) for _ in range(rng.randint(6, 16))
            ]  # never the mask id 511
            f.write(json.dumps({"id": f"p{i}", "prompt_ids": ids}) + "\n")
    return {
        "prompts": root / "prompts.jsonl",
        "cache": root / "cache",
        "verifier": fixture_dir / "verifier",
    }


def args(data, out: Path, *extra: str, steps: int = 20) -> list[str]:
    return [
        "train",
        "--verifier",
        str(data["verifier"]),
        "--prompts",
        str(data["prompts"]),
        "--out",
        str(out),
        "--cache-dir",
        str(data["cache"]),
        "--steps",
        str(steps),
        "--max-new-tokens",
        "40",
        "--aux-layers",
        AUX,
        "--lr",
        "3e-3",
        "--warmup-steps",
        "2",
        "--log-every",
        "5",
        "--checkpoint-every",
        "10",
        "--threads",
        "1",
        "--no-progress",
        *extra,
    ]


# Checkpoint and log every 5 steps, with the learning rate and warm-up of the resume tests.
EVERY_5 = dict(checkpoint_every=5, log_every=5, lr=3e-3, warmup_steps=2)


def config(data, out: Path, **kw) -> TrainConfig:
    """A TrainConfig on the fixture data writing to ``out``, with ``kw`` on top."""
    fixture = dict(verifier=str(data["verifier"]), prompts=str(data["prompts"]))
    at = dict(out=str(out), cache_dir=str(data["cache"]))
    return TrainConfig.from_dict(
        {**fixture, **at, "max_new_tokens": 40, "aux_layer_ids": [1, 3, 4], **kw}
    )


def logged(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


ALGORITHM_ARGS = {
    "dflash": [],
    # Warm start from the speculators DFlash fixture (same verifier and widths).
    "dspark": ["--markov-rank", "16", "--init-from", "FIXTURES/dflash"],
    "peagle": ["--depths", "4"],
    "eagle3": ["--ttt-steps", "3"],
}


@pytest.mark.parametrize("algorithm", list(ALGORITHM_ARGS))
def test_train_lowers_the_loss_and_saves_a_loadable_drafter(
    algorithm, data, fixture_dir, fixture_verifier, tmp_path, capsys
):
    out = tmp_path / algorithm
    extra = [a.replace("FIXTURES", str(fixture_dir)) for a in ALGORITHM_ARGS[algorithm]]
    assert main(args(data, out, "--algorithm", algorithm, *extra)) == 0
    assert "finished at step 20" in capsys.readouterr().out

    rows = logged(out)
    assert [r["step"] for r in rows] == [5, 10, 15, 20]
    assert rows[-1]["loss"] < rows[0]["loss"], [r["loss"] for r in rows]
    assert all(f"acc_{k}" in rows[-1] for k in (1, 2, 3))
    assert rows[-1]["accept_len"] >= 1.0

    assert validate_checkpoint(out, fixture_verifier) == []
    drafter = load_drafter(out, fixture_verifier)
    assert drafter.algorithm == algorithm
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == algorithm
    # The final drafter is the last checkpoint's weights.
    final, last = (
        load_file(str(out / "model.safetensors")),
        load_file(str(latest_checkpoint(out).path / "model.safetensors")),
    )
    assert latest_checkpoint(out).step == 20
    assert all(torch.equal(final[k], last[k]) for k in final)


def test_snapshot_steps_keep_servable_drafters_the_rolling_checkpoints_prune(
    data, fixture_verifier, tmp_path, capsys
):
    out = tmp_path / "snap"
    extra = ["--algorithm", "dflash", "--checkpoint-every", "2", "--keep-checkpoints", "1"]
    assert main(args(data, out, *extra, "--snapshot-steps", "3,4", "6", steps=6)) == 0
    assert [c.step for c in list_checkpoints(out)] == [6]  # the rolling ones: the newest only
    snaps = sorted(p.name for p in (out / "snapshots").iterdir())
    assert snaps == ["step-00000003", "step-00000004", "step-00000006"]
    for name in snaps:
        assert validate_checkpoint(out / "snapshots" / name, fixture_verifier) == []
        assert json.loads((out / "snapshots" / name / "config.json").read_text())["dtype"] == (
            "bfloat16"
        )
    # The last snapshot is the final drafter, rounded to bf16; an earlier one differs from it.
    final = load_file(str(out / "model.safetensors"))
    last = load_file(str(out / "snapshots" / "step-00000006" / "model.safetensors"))
    first = load_file(str(out / "snapshots" / "step-00000003" / "model.safetensors"))
    assert all(torch.equal(final[k].to(torch.bfloat16), last[k]) for k in final)
    assert any(not torch.equal(first[k], last[k]) for k in last)
    assert "snapshot" in capsys.readouterr().out


def test_eagle3_trained_on_fewer_ttt_steps_writes_the_k_it_is_asked_to_draft(
    data, fixture_verifier, tmp_path
):
    out = tmp_path / "k"
    extra = ["--algorithm", "eagle3", "--ttt-steps", "2", "--num-speculative-tokens", "5"]
    assert main(args(data, out, *extra, "--snapshot-steps", "2", steps=3)) == 0
    for folder in (out, out / "snapshots" / "step-00000002"):
        config = json.loads((folder / "config.json").read_text())
        method = config["speculators_config"]["proposal_methods"][0]
        assert method["speculative_tokens"] == 5, folder
    assert load_drafter(out, fixture_verifier).num_speculative_tokens == 5
    # Without the setting the written K is what it trained: its TTT steps.
    plain = tmp_path / "plain"
    assert main(args(data, plain, "--algorithm", "eagle3", "--ttt-steps", "2", steps=1)) == 0
    assert load_drafter(plain, fixture_verifier).num_speculative_tokens == 2
    with pytest.raises(SpecUIError, match="num-speculative-tokens"):
        TrainConfig(algorithm="eagle3", num_speculative_tokens=0)


def test_dspark_warm_start_copies_the_dflash_backbone(data, fixture_dir, fixture_verifier):
    from specui.algorithms.objective import objective_for
    from specui.training.model import warm_start

    cfg = TrainConfig(
        algorithm="dspark",
        verifier=str(data["verifier"]),
        aux_layer_ids=[1, 3, 4],
        options=DSparkOptions(markov_rank=16),
    )
    model = objective_for(cfg, fixture_verifier).build()
    said = []
    warm_start(model, fixture_dir / "dflash", fixture_verifier, TrainHooks(log=said.append))
    ref = load_model(fixture_dir / "dflash", fixture_verifier).state_dict()
    assert torch.equal(model.fc.weight, ref["fc.weight"])
    assert torch.equal(model.layers[1].mlp.down_proj.weight, ref["layers.1.mlp.down_proj.weight"])
    assert "markov_head.markov_w1.weight" in said[0]  # reported as new


@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.0, 2.0])
def test_dspark_confidence_target_is_the_acceptance_chance_at_its_temperature(
    temperature, data, fixture_verifier
):
    """The head's BCE target: 1 - TV of draft and verifier distributions at the configured
    temperature; at 0 both are one-hot, so it is whether the argmaxes agree."""
    from specui.algorithms.dspark.objective import DSparkObjective
    from specui.algorithms.objective import Targets

    cfg = TrainConfig(
        algorithm="dspark",
        verifier=str(data["verifier"]),
        aux_layer_ids=[1, 3, 4],
        options=DSparkOptions(markov_rank=16, confidence_temperature=temperature),
    )
    objective = DSparkObjective(cfg, fixture_verifier)
    gen = torch.Generator().manual_seed(0)
    logits, targets = (
        torch.randn(3, 4, 50, generator=gen) * 3,
        torch.randn(3, 4, 50, generator=gen) * 3,
    )
    targets[0, :2] = logits[0, :2]  # some slots agree, so a greedy target has both outcomes
    tv1 = 1 - torch.minimum(logits.softmax(-1), targets.softmax(-1)).sum(-1)
    hit = logits.argmax(-1) == targets.argmax(-1)
    got = objective.acceptance_target(
        logits, Targets.from_logits(targets, 50), tv1, hit
    )  # k = V: exact
    if temperature == 0:
        expected = hit.float()
        assert 0 < expected.mean() < 1
    else:
        expected = torch.minimum(
            (logits / temperature).softmax(-1), (targets / temperature).softmax(-1)
        ).sum(-1)
    torch.testing.assert_close(got, expected)
    if temperature not in (0.0, 1.0):
        assert not torch.allclose(got, 1 - tv1)  # the temperature changes the target


def test_negative_confidence_temperature_is_refused():
    with pytest.raises(SpecUIError, match="confidence-temperature"):
        TrainConfig.from_dict({"algorithm": "dspark", "confidence_temperature": -1})


def test_warm_start_keeps_the_source_draft_vocabulary(data, fixture_verifier, tmp_path):
    """A warm start on other data must keep the source's draft vocabulary: its draft-head
    rows and d2t are copied, so a recounted vocabulary would map them to other tokens."""
    other = tmp_path / "other.jsonl"
    rng = random.Random(1)
    with open(other, "w") as f:
        for i in range(16):
            f.write(
                json.dumps(
                    {"id": f"q{i}", "prompt_ids": [rng.randrange(250, 500) for _ in range(12)]}
                )
                + "\n"
            )

    def run(out: Path, prompts: Path, init_from: Path | None = None):
        init = dict(draft_vocab_size=64, init_from=str(init_from) if init_from else None)
        short = dict(steps=2, log_every=1, lr=3e-3, warmup_steps=0)
        return train(config(data, out, algorithm="eagle3", prompts=str(prompts), **short, **init))

    source = run(tmp_path / "src", data["prompts"])
    fresh = run(tmp_path / "fresh", other)
    warm = run(tmp_path / "warm", other, init_from=tmp_path / "src")
    src_d2t = load_file(str(tmp_path / "src" / "model.safetensors"))["d2t"]
    # The other prompts' most frequent tokens differ, so only the inherited vocabulary matches.
    assert not torch.equal(load_file(str(tmp_path / "fresh" / "model.safetensors"))["d2t"], src_d2t)
    assert torch.equal(load_file(str(tmp_path / "warm" / "model.safetensors"))["d2t"], src_d2t)
    assert torch.equal(
        warm.model.lm_head.weight, source.model.lm_head.weight
    )  # frozen head rows, same tokens
    assert fresh.model is not None


def test_warm_start_onto_another_draft_vocabulary_moves_the_shared_tokens_rows():
    """General data after math: a larger draft vocabulary keeps the head rows of the tokens
    both vocabularies hold (at their new slots); the new tokens keep their fresh init."""
    from specui.algorithms.draft_vocab import remap_draft_vocab_rows

    def d2t(ids):
        return torch.tensor(ids) - torch.arange(len(ids))

    old = {
        "d2t": d2t([5, 7, 9]),
        "lm_head.weight": torch.tensor([[5.0, 5], [7, 7], [9, 9]]),
        "fc.weight": torch.ones(2, 2),
    }
    own = {
        "d2t": d2t([5, 7, 11, 13]),
        "lm_head.weight": torch.zeros(4, 2),
        "fc.weight": torch.zeros(3, 2),
    }
    moved = remap_draft_vocab_rows(old, own)
    assert set(moved) == {
        "lm_head.weight"
    }  # d2t stays the run's own; fc is not a vocabulary tensor
    assert moved["lm_head.weight"].tolist() == [[5, 5], [7, 7], [0, 0], [0, 0]]
    same = remap_draft_vocab_rows(old, {**own, "d2t": old["d2t"]})
    assert torch.equal(same["d2t"], old["d2t"])


# --- bad input --------------------------------------------------------------------------------


def test_unknown_algorithm_is_refused(data, tmp_path, capsys):
    assert main(args(data, tmp_path / "o", "--algorithm", "medusa")) == 2
    assert "unknown algorithm 'medusa'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # a failed start leaves nothing behind


def test_prompt_file_without_usable_rows_is_refused(data, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x"}\nnot json\n')
    a = args(data, tmp_path / "o", "--algorithm", "dflash")
    a[a.index("--prompts") + 1] = str(bad)
    assert main(a) == 2
    err = capsys.readouterr().err
    assert "no usable rows" in err and "line 1" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("verifier", ["missing-folder/", "EMPTY", "BROKEN"])
def test_verifier_that_cannot_be_loaded_is_refused(verifier, data, tmp_path, capsys):
    if verifier == "EMPTY":  # a folder without config.json
        (tmp_path / "v").mkdir()
        verifier = str(tmp_path / "v")
    elif verifier == "BROKEN":  # config.json but no usable weights
        (tmp_path / "v").mkdir()
        (tmp_path / "v" / "config.json").write_text(
            json.dumps({"model_type": "qwen3", "hidden_size": 8})
        )
        verifier = str(tmp_path / "v")
    a = args(data, tmp_path / "o", "--algorithm", "dflash")
    a[a.index("--verifier") + 1] = verifier
    assert main(a) == 2
    assert "verifier" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_existing_checkpoints_need_resume(data, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(args(data, out, "--algorithm", "eagle3", steps=2)) == 0
    assert main(args(data, out, "--algorithm", "eagle3", steps=4)) == 2
    assert "--resume" in capsys.readouterr().err


def test_short_responses_for_the_block_size_are_a_clear_error(data, tmp_path, capsys):
    assert main(args(data, tmp_path / "o", "--algorithm", "dflash", "--block-size", "64")) == 2
    assert "response long enough" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # failed after the self-distillation (cached elsewhere)


def test_a_failed_start_keeps_a_folder_it_did_not_create_and_what_it_wrote(data, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    assert main(args(data, mine, "--algorithm", "medusa")) == 2
    assert mine.is_dir()  # the user's own folder stays
    # The default cache lies in --out: the self-distilled responses are kept for the next try.
    a = args(data, tmp_path / "o", "--algorithm", "dflash", "--block-size", "64")
    del a[a.index("--cache-dir") : a.index("--cache-dir") + 2]
    assert main(a) == 2
    assert [p.name for p in (tmp_path / "o").iterdir()] == ["cache"]
    assert any((tmp_path / "o" / "cache").iterdir())
    capsys.readouterr()


def test_an_output_folder_that_cannot_be_made_is_refused_before_any_work(data, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(args(data, tmp_path / "file" / "o", "--algorithm", "dflash")) == 2
    err = capsys.readouterr().err
    assert "cannot create the output folder" in err and "is not a folder" in err
    assert "self-distillation" not in err


# --- checkpoints, failures, resume ---------------------------------------------------------------


def test_failed_checkpoint_write_keeps_the_previous_one_loadable(data, fixture_verifier, tmp_path):
    out = tmp_path / "o"
    assert main(args(data, out, "--algorithm", "dflash", "--checkpoint-every", "5", steps=10)) == 0
    before = latest_checkpoint(out)
    assert before.step == 10

    # A real write failure: files may not grow past 64 KB (the drafter's weights are ~350 KB),
    # so the next checkpoint fails halfway through writing model.safetensors.
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        with pytest.raises(SpecUIError, match="could not save the checkpoint of step 15"):
            train(config(data, out, algorithm="dflash", steps=15, resume=True, **EVERY_5))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)

    assert latest_checkpoint(out).step == 10
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    assert validate_checkpoint(before.path, fixture_verifier) == []
    load_drafter(before.path, fixture_verifier)
    # And training goes on from it once the disk has room again.
    again = args(
        data, out, "--algorithm", "dflash", "--checkpoint-every", "5", "--resume", steps=15
    )
    assert main(again) == 0
    assert latest_checkpoint(out).step == 15


def test_resume_after_sigkill_continues_from_the_last_checkpoint(data, tmp_path):
    out = tmp_path / "o"
    a = args(data, out, "--algorithm", "dflash", "--checkpoint-every", "5", steps=100000)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "specui", *a],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 90
        while latest_checkpoint(out) is None or latest_checkpoint(out).step < 10:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.1)
    finally:
        proc.kill()  # SIGKILL: no chance to save anything more
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = latest_checkpoint(out).step
    logged_before = [r["step"] for r in logged(out)]

    more = dict(steps=killed_at + 5, resume=True, threads=1)
    r = train(config(data, out, algorithm="dflash", **more, **EVERY_5))
    assert r.resumed_from == killed_at and r.step == killed_at + 5
    steps = [row["step"] for row in logged(out)]
    # The step count went on, not from 0, and the steps the killed run logged past its last
    # checkpoint (logged again by the resumed run) were dropped: each step once.
    assert steps == [s for s in logged_before if s <= killed_at] + [killed_at + 5]
    assert [c.step for c in list_checkpoints(out)][-1] == killed_at + 5


def test_resumed_run_matches_an_uninterrupted_one(data, tmp_path):
    def run(out: Path, steps: int, resume: bool = False):
        every_3 = dict(checkpoint_every=3, log_every=3, lr=3e-3, warmup_steps=2)
        how = dict(steps=steps, resume=resume, schedule="constant")
        return train(config(data, out, algorithm="peagle", **how, **every_3))

    straight = run(tmp_path / "a", 6)
    run(tmp_path / "b", 3)
    resumed = run(tmp_path / "b", 6, resume=True)
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_cancel_saves_a_checkpoint_and_stops(data, tmp_path):
    calls = []

    def cancelled() -> bool:
        calls.append(1)
        return len(calls) > 3  # after three steps

    r = train(
        config(data, tmp_path / "o", algorithm="eagle3", steps=50), TrainHooks(cancelled=cancelled)
    )
    assert r.status == "cancelled" and r.step == 3
    assert latest_checkpoint(tmp_path / "o").step == 3
    assert not (tmp_path / "o" / "model.safetensors").exists()  # no "final" drafter when cancelled


# --- several processes ---------------------------------------------------------------------------


def test_two_process_ddp_keeps_the_ranks_identical(data, tmp_path):
    out = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(REPO / "tests" / "support" / "ddp_train.py"),
        str(out),
        str(data["verifier"]),
        str(data["prompts"]),
        str(data["cache"]),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    r0, r1 = load_file(str(out / "rank0.safetensors")), load_file(str(out / "rank1.safetensors"))
    saved = load_file(str(out / "model.safetensors"))
    assert set(r0) == set(r1)
    assert all(torch.equal(r0[k], r1[k]) for k in r0)
    assert all(torch.equal(r0[k], saved[k]) for k in saved)
    start = load_file(str(out / "rank0-init.safetensors"))
    assert any(not torch.equal(start[k], r0[k]) for k in start)  # it did train
    run = json.loads((out / "train_run.json").read_text())
    assert run["world_size"] == 2 and run["status"] == "finished"


# --- the real verifier ----------------------------------------------------------------------


@pytest.mark.slow
def test_train_on_the_embedded_smollm2(embedded_verifier, tmp_path, capsys):
    out = tmp_path / "smol"
    t0 = time.monotonic()
    rc = main(
        [
            "train",
            "--algorithm",
            "dflash",
            "--verifier",
            "embedded",
            "--prompts",
            "demo",
            "--num-prompts",
            "4",
            "--out",
            str(out),
            "--steps",
            "8",
            "--batch-size",
            "2",
            "--max-new-tokens",
            "24",
            "--block-size",
            "4",
            "--max-anchors",
            "8",
            "--draft-vocab-size",
            "512",
            "--mask-token-id",
            "16",
            "--layers",
            "1",
            "--lr",
            "3e-3",
            "--warmup-steps",
            "1",
            "--log-every",
            "4",
            "--checkpoint-every",
            "4",
            "--threads",
            "1",
            "--no-progress",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    assert time.monotonic() - t0 < 60
    rows = logged(out)
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert validate_checkpoint(out, embedded_verifier) == []
    drafter = load_drafter(out, embedded_verifier)
    assert drafter.model.config.draft_vocab_size == 512 and drafter.model.d2t is not None
    assert drafter.model.config.mask_token_id == 16


def _tiny_run(tmp_path, fixture_dir, prompts: int, **settings) -> dict:
    """A DFlash run's settings on the fixture verifier over ``prompts`` random token prompts."""
    import json
    import random

    rng = random.Random(prompts)
    path = tmp_path / "prompts.jsonl"
    ids = [[rng.randrange(500) for _ in range(8)] for _ in range(prompts)]
    path.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in ids))
    return dict(
        algorithm="dflash",
        verifier=str(fixture_dir / "verifier"),
        prompts=str(path),
        max_new_tokens=16,
        aux_layer_ids=[1, 3, 4],
        batch_size=2,
        block_size=4,
        warmup_steps=0,
        threads=1,
        **settings,
    )


def test_a_run_on_the_int8_hidden_store_keeps_int8_files_and_trains(tmp_path, fixture_dir):
    """--hidden-store int8 (the campaign's): the extracted files are the compact form, the
    disk estimate is the compact one, and training reads them."""
    import json

    from safetensors import safe_open

    from specui.training.config import TrainConfig
    from specui.training.hooks import TrainHooks
    from specui.training.loop import train

    base = _tiny_run(tmp_path, fixture_dir, 6, extraction="offline", steps=2, log_every=1)
    said: dict[str, list[str]] = {}  # the extraction lines each run logged
    for store in ("bf16", "int8"):
        lines: list[str] = []
        cfg = TrainConfig.from_dict(
            {
                **base,
                "hidden_store": store,
                "cache_dir": str(tmp_path / store),
                "out": str(tmp_path / f"out-{store}"),
            }
        )
        assert train(cfg, TrainHooks(log=lines.append)).status == "finished"
        said[store] = [x for x in lines if "extracting hidden states" in x]
        assert said[store], lines  # offline: everything extracted before the first step
        files = list((tmp_path / store / "hidden").glob("*.safetensors"))
        assert files
        with safe_open(str(files[0]), "pt") as f:
            names = set(f.keys())  # noqa: SIM118 (a safe_open handle has no __contains__)
        assert ("hidden_scale" in names) == (store == "int8")
    size = {s: sum(p.stat().st_size for p in (tmp_path / s / "hidden").iterdir()) for s in said}
    assert size["int8"] < size["bf16"] / 2
    assert (
        json.loads((tmp_path / "out-int8" / "train_run.json").read_text())["config"]["hidden_store"]
        == "int8"
    )


def test_held_out_evaluation_scores_prompts_no_step_trains_on(tmp_path, fixture_dir):
    """--eval-every: heldout_* metrics in metrics.jsonl at each evaluation step, from the prompt
    set's held-out split only, the same samples and anchors every time."""
    import json

    from specui.data.prompts import load_prompts
    from specui.training.config import TrainConfig
    from specui.training.heldout import HeldOut
    from specui.training.hooks import TrainHooks
    from specui.training.loop import train
    from specui.verifier.model import Verifier

    settings = _tiny_run(
        tmp_path, fixture_dir, 30, steps=4, log_every=3, eval_every=2, eval_samples=4,
        out=str(tmp_path / "out"),
    )  # fmt: skip
    cfg = TrainConfig.from_dict(settings)
    prompts = settings["prompts"]
    result = train(cfg, TrainHooks())
    assert result.status == "finished"
    lines = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    held = {x["step"]: x for x in lines if "heldout_accept_len_expected" in x}
    assert sorted(held) == [2, 4]  # every 2 steps (a logging line each), and the last
    assert 3 in {x["step"] for x in lines}  # the log_every lines stay
    assert all(
        x["heldout_loss"] > 0 and x["heldout_accept_len_expected"] >= 1 for x in held.values()
    )

    verifier = Verifier.load(cfg.verifier)
    from specui.algorithms.objective import objective_for

    train_ids = {tuple(p.token_ids) for p in load_prompts(str(prompts), split="train")}
    objective = objective_for(cfg, verifier)
    h = HeldOut(cfg, verifier, objective, [1, 3, 4], tmp_path / "out" / "cache")
    assert h.samples and not {s.prompt_ids for s in h.samples} & train_ids
    model = result.model
    assert h.evaluate(model) == h.evaluate(model)  # deterministic: the drafter alone moves it
