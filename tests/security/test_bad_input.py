"""The bad-input matrix: every way a user can feed SpecUI nonsense, on every surface.

Surfaces: the CLI (``specui decode / bench / train / runs``; in-process through
``specui.cli.main`` as the other CLI tests do, plus real processes where the
process boundary matters: argv bytes, logging to stderr) and the app's named API
endpoints (``/decode``, ``/bench``, ``/compare``, ``/export``) through
gradio_client against one real ``python app.py`` for the module.

Each bad input must give one clear message (CLI: exit 2 and a single
``specui: error: ...`` line, no traceback; API: a gr.Error carrying the
message), leave no run row behind (nothing "running", no row for a call refused
before decoding), no temp files, and an app that still decodes afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from specui.data.prompts import MAX_PROMPT_CHARS, FileProblem, read_prompt_file
from specui.errors import SpecUIError
from specui.store import Store
from specui.trace import MAX_SEED
from tests.support.app_server import running_app
from tests.support.cli_errors import assert_one_error, cli
from tests.support.paths import FIXTURES, REPO

OVER_CONTEXT = (
    "word " * 9000
)  # ~9000 tokens: past SmolLM2's 8192-token window, under the character cap
OVER_CAP = "x" * (MAX_PROMPT_CHARS + 1)


def tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


# --- speculator folders, broken in every way a folder can be ------------------------------


def _edit_config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def _truncate(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def _nan_weights(folder: Path) -> None:
    tensors = load_file(folder / "model.safetensors")
    key = next(k for k, t in sorted(tensors.items()) if t.is_floating_point())
    tensors[key] = tensors[key].clone()
    tensors[key].view(-1)[0] = float("nan")
    save_file(tensors, folder / "model.safetensors")


def _k_too_big(folder: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 10_000
    (folder / "config.json").write_text(json.dumps(cfg))


BROKEN_FOLDERS = {
    # case: (how to break a copy of the fixture DFlash folder, the message)
    "missing-config": (lambda f: (f / "config.json").unlink(), "has no config.json"),
    "missing-weights": (lambda f: (f / "model.safetensors").unlink(), "has no model.safetensors"),
    "truncated-weights": (_truncate, "is not a readable safetensors file"),
    "random-weights": (
        lambda f: (f / "model.safetensors").write_bytes(os.urandom(4096)),
        "is not a readable safetensors file",
    ),
    "config-not-json": (
        lambda f: (f / "config.json").write_text("{speculators: yes"),
        "config.json is not valid JSON",
    ),
    "config-binary": (
        lambda f: (f / "config.json").write_bytes(b"\xff\xfe\x00\x01"),
        "config.json is not valid JSON",
    ),
    "unknown-type": (
        lambda f: _edit_config(f, speculators_model_type="medusa"),
        "unknown speculators_model_type 'medusa'",
    ),
    "nan-weights": (_nan_weights, "contains NaN or infinity"),
    "k-10000-in-config": (_k_too_big, "speculative_tokens must be in 1..256"),
}


def broken_folder(root: Path, case: str) -> Path:
    folder = root / f"broken-{case}"
    shutil.copytree(FIXTURES / "dflash", folder)
    BROKEN_FOLDERS[case][0](folder)
    return folder


# === CLI ===================================================================================

PROMPT_CASES = {
    "empty": (["--prompt", ""], "the prompt is empty"),
    "whitespace": (["--prompt", " \n\t  "], "the prompt is empty"),
    "over-context": (["--prompt", OVER_CONTEXT], "the verifier's context window is 8192"),
    "over-cap": (["--prompt", OVER_CAP], f"the limit is {MAX_PROMPT_CHARS:,}"),
    "nul-bytes": (["--prompt", "two\x00words"], "contains NUL bytes"),
    # What Python makes of undecodable argv bytes (surrogateescape); a real process below.
    "invalid-utf8": (["--prompt", "caf\udcc3\udca9"], "not valid UTF-8"),
    "only-special": (["--prompt", "<|im_end|><|endoftext|>"], "only special tokens"),
    "only-special-chat": (["--prompt", "<|im_start|>", "--chat"], "only special tokens"),
    "ids-not-ints": (["--prompt-ids", "1 two 3"], "--prompt-ids takes integers"),
    "ids-empty": (["--prompt-ids", " , "], "the prompt is empty"),
    "ids-negative": (["--prompt-ids", "1 -2 3"], "prompt token ids must lie in 0..49151"),
    "ids-past-vocab": (["--prompt-ids", "1 49152"], "prompt token ids must lie in 0..49151"),
    "ids-over-cap": (["--prompt-ids", "1 " * 200_001], "the limit is 200,000"),
}


@pytest.mark.parametrize("case", PROMPT_CASES)
def test_cli_decode_bad_prompt(capsys, embedded_verifier, case):
    args, message = PROMPT_CASES[case]
    rc, out, err = cli(capsys, "decode", *args, "--max-new-tokens", "2")
    assert_one_error(rc, err, message)
    assert out == ""


SETTING_CASES = {
    "k-zero": (["-k", "0"], "number of speculative tokens (K) must be in 1..256, got 0"),
    "k-negative": (["-k", "-3"], "must be in 1..256, got -3"),
    "k-10000": (["-k", "10000"], "must be in 1..256, got 10000"),
    "temperature-negative": (["--temperature", "-0.5"], "temperature must be >= 0"),
    "temperature-nan": (["--temperature", "nan"], "temperature must be >= 0"),
    "top-p-over-1": (["--top-p", "1.5"], "top_p must be in (0, 1]"),
    "top-p-zero": (["--top-p", "0"], "top_p must be in (0, 1]"),
    "top-p-negative": (["--top-p", "-0.1"], "top_p must be in (0, 1]"),
    "top-k-negative": (["--top-k", "-1"], "top_k must be >= 0"),
    "max-new-zero": (["--max-new-tokens", "0"], "max_new_tokens must be >= 1, got 0"),
    "max-new-negative": (["--max-new-tokens", "-5"], "max_new_tokens must be >= 1, got -5"),
    "max-new-huge": (
        ["--max-new-tokens", "1000000"],
        "more than the verifier's context window (8192 tokens)",
    ),
    "max-new-enormous": (
        ["--max-new-tokens", str(10**30)],
        "more than the verifier's context window",
    ),
    "max-new-not-int": (
        ["--max-new-tokens", "lots"],
        "argument --max-new-tokens: invalid int value: 'lots'",
    ),
    "seed-not-int": (["--seed", "abc"], "argument --seed: invalid int value: 'abc'"),
    "seed-float": (["--seed", "1.5"], "argument --seed: invalid int value: '1.5'"),
    "seed-negative": (["--seed", "-1"], f"seed must be in 0..{MAX_SEED}, got -1"),
    "seed-too-big": (["--seed", str(2**70)], f"seed must be in 0..{MAX_SEED}"),
    "k-not-int": (["-k", "four"], "invalid int value: 'four'"),
    "threads-zero": (["--threads", "0"], "--threads must be >= 1"),
}


@pytest.mark.parametrize("case", SETTING_CASES)
def test_cli_decode_bad_setting(capsys, embedded_verifier, case):
    args, message = SETTING_CASES[case]
    rc, out, err = cli(
        capsys,
        "decode",
        "--prompt",
        "Hello there",
        "--drafter",
        "ngram",
        "--max-new-tokens",
        "2",
        *args,
    )
    assert_one_error(rc, err, message)
    assert out == ""


@pytest.mark.parametrize("case", BROKEN_FOLDERS)
def test_cli_decode_broken_speculator_folder(capsys, tmp_path, fixture_verifier, case):
    folder = broken_folder(tmp_path, case)
    before = tree(tmp_path)
    rc, out, err = cli(
        capsys,
        "decode",
        "--verifier",
        str(FIXTURES / "verifier"),
        "--drafter",
        str(folder),
        "--prompt-ids",
        "5 17 300",
        "--max-new-tokens",
        "2",
    )
    assert_one_error(rc, err, BROKEN_FOLDERS[case][1])
    assert f"cannot load drafter {folder}" in err
    assert tree(tmp_path) == before  # nothing written beside the folder (no temp files)


def test_cli_decode_speculator_for_another_verifier(capsys, embedded_verifier):
    # The fixture DFlash was trained for the tiny fixture verifier, not SmolLM2: every mismatch
    # is named.
    rc, _, err = cli(
        capsys,
        "decode",
        "--drafter",
        str(FIXTURES / "dflash"),
        "--prompt",
        "Hi",
        "--max-new-tokens",
        "2",
    )
    assert_one_error(rc, err, "hidden size 64 does not match the verifier's 576")
    assert "vocab size 512 does not match the verifier's 49152" in err


def test_cli_speculator_path_is_a_file(capsys, tmp_path, embedded_verifier):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"\0" * 16)
    rc, _, err = cli(
        capsys, "decode", "--drafter", str(f), "--prompt", "Hi", "--max-new-tokens", "2"
    )
    assert_one_error(rc, err, "is a file")


def test_cli_invalid_utf8_argv_in_a_real_process(tmp_path):
    # Bytes that are not UTF-8 reach Python as surrogates; the tokenizer would raise a TypeError.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specui",
            "decode",
            "--prompt",
            b"caf\xc3\x28 \xff\xfe",
            "--max-new-tokens",
            "2",
        ],
        capture_output=True,
        cwd=REPO,
        timeout=300,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
    )
    err = proc.stderr.decode("utf-8", "replace")
    assert_one_error(proc.returncode, err, "the prompt is not valid UTF-8 text")


def test_cli_argparse_error_is_one_line_in_a_real_process():
    proc = subprocess.run(
        [sys.executable, "-m", "specui", "decode", "--prompt", "hi", "--seed", "abc"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr
        == "specui: error: argument --seed: invalid int value: 'abc' (see specui decode --help)\n"
    )


# --- prompt sets (JSONL files) ---------------------------------------------------------------


def _mixed_file(path: Path) -> Path:
    rows = [
        json.dumps({"prompt": "Say yes."}).encode(),
        b'{"prompt": "unterminated',  # line 2: broken JSON
        json.dumps({"messages": [{"role": "user", "content": "Say no."}]}).encode(),
        b'{"prompt": "caf\xff"}',  # line 4: not UTF-8
        json.dumps({"prompt": 42}).encode(),  # line 5: wrong type
        json.dumps({"prompt_ids": "1 2 3"}).encode(),  # line 6: wrong type
        json.dumps({"prompt": "a\u0000b"}).encode(),  # line 7: NUL through a JSON escape
        json.dumps({"prompt": "x" * (MAX_PROMPT_CHARS + 1)}).encode(),  # line 8: over the cap
        b"",
        json.dumps({"prompt": "Say maybe."}).encode(),  # line 10: good
        b"[1, 2]",  # line 11: not an object
    ]
    path.write_bytes(b"\n".join(rows) + b"\n")
    return path


def test_prompt_file_reports_each_broken_line_and_keeps_the_good_ones(tmp_path):
    problems: list[FileProblem] = []
    prompts = read_prompt_file(_mixed_file(tmp_path / "mixed.jsonl"), problems)
    assert [p.text or p.messages[0]["content"] for p in prompts] == [
        "Say yes.",
        "Say no.",
        "Say maybe.",
    ]
    by_line = {p.line: p.message for p in problems}
    assert sorted(by_line) == [2, 4, 5, 6, 7, 8, 11]
    assert "not valid JSON" in by_line[2]
    assert by_line[4] == "not valid UTF-8 (byte 0xff at column 16)"
    assert "'prompt' must be a non-empty string" in by_line[5]
    assert "'prompt_ids' must be a list" in by_line[6]
    assert "contains NUL bytes" in by_line[7]
    assert f"the limit is {MAX_PROMPT_CHARS:,}" in by_line[8]
    assert by_line[11] == "not a JSON object"


def test_cli_bench_reports_broken_lines_on_stderr_and_runs_the_good_ones(tmp_path):
    # A real process: the line-numbered warnings go through logging to stderr.
    db = tmp_path / "s.db"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specui",
            "bench",
            "--prompts",
            str(_mixed_file(tmp_path / "mixed.jsonl")),
            "--drafter",
            "ngram",
            "--max-new-tokens",
            "2",
            "--db",
            str(db),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    for line in (2, 4, 5, 6, 7, 8, 11):
        assert f"mixed.jsonl: line {line}: " in proc.stderr
    assert "Traceback" not in proc.stderr
    run_ids = json.loads(proc.stdout)["run_ids"]
    with Store(db) as store:
        assert [len(store.get_results(r)) for r in run_ids] == [3, 3]
        assert {str(r.status) for r in store.list_runs()} == {"done"}


PROMPT_FILE_CASES = {
    "empty-file": (b"", "(the file is empty)"),
    "blank-lines": (b"\n \n\n", "(the file is empty)"),
    "all-broken-json": (b'{oops\n{"prompt": \n', "first problem: line 1: not valid JSON"),
    "wrong-types": (
        b'{"prompt": ["a"]}\n{"messages": "hi"}\n',
        "first problem: line 1: 'prompt' must be a non-empty string",
    ),
    "not-utf8": (b"\xff\xfe\x00{\x00}\n", "first problem: line 1: not valid UTF-8"),
    "binary": (bytes(range(256)) * 4, "first problem: line 1: not valid JSON"),
}


def _bench_ngram(capsys, prompts: Path, db: Path) -> tuple[int, str, str]:
    """``specui bench`` of n-gram on a prompt file, two tokens, into ``db``."""
    args = ["--prompts", str(prompts), "--drafter", "ngram", "--max-new-tokens", "2"]
    return cli(capsys, "bench", *args, "--db", str(db))


@pytest.mark.parametrize("case", PROMPT_FILE_CASES)
def test_cli_bench_unusable_prompt_file(capsys, tmp_path, embedded_verifier, case):
    content, message = PROMPT_FILE_CASES[case]
    path = tmp_path / "set.jsonl"
    path.write_bytes(content)
    db = tmp_path / "s.db"
    rc, _, err = _bench_ngram(capsys, path, db)
    assert_one_error(rc, err, f"prompt file {path} has no usable rows")
    assert message in err
    assert Store(db).list_runs() == []


def test_cli_bench_missing_prompt_file(capsys, tmp_path):
    rc, _, err = cli(
        capsys,
        "bench",
        "--prompts",
        str(tmp_path / "nope.jsonl"),
        "--drafter",
        "ngram",
        "--db",
        str(tmp_path / "s.db"),
    )
    assert_one_error(rc, err, "no prompt set or file named")


BENCH_SETTING_CASES = {
    "k-zero": (["-k", "0"], "must be in 1..256, got 0"),
    "k-10000": (["-k", "10000"], "must be in 1..256, got 10000"),
    "temperature-negative": (["--temperature", "-1"], "temperature must be >= 0"),
    "top-p-over-1": (["--top-p", "2"], "top_p must be in (0, 1]"),
    "top-k-negative": (["--top-k", "-2"], "top_k must be >= 0"),
    "max-new-zero": (["--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
    "seed-not-int": (["--seed", "x"], "invalid int value: 'x'"),
    "seed-negative": (["--seed", "-4"], "seed must be in"),
    "limit-zero": (["--limit", "0"], "--limit must be >= 1"),
}


@pytest.mark.parametrize("case", BENCH_SETTING_CASES)
def test_cli_bench_bad_setting_stores_nothing(capsys, tmp_path, case):
    args, message = BENCH_SETTING_CASES[case]
    db = tmp_path / "s.db"
    rc, _, err = cli(capsys, "bench", "--drafter", "ngram", "--db", str(db), *args)
    assert_one_error(rc, err, message)
    assert not db.exists()  # refused before the store was even opened


def test_cli_bench_prompt_over_the_context_window_stores_no_run(
    capsys, tmp_path, embedded_verifier
):
    path = tmp_path / "long.jsonl"
    path.write_text(
        json.dumps({"prompt": "Hi."}) + "\n" + json.dumps({"prompt": OVER_CONTEXT}) + "\n"
    )
    db = tmp_path / "s.db"
    rc, _, err = _bench_ngram(capsys, path, db)
    assert_one_error(rc, err, "the verifier's context window is 8192")
    assert Store(db).list_runs() == []


def test_cli_bench_speculator_for_another_verifier_stores_no_run(
    capsys, tmp_path, embedded_verifier
):
    db = tmp_path / "s.db"
    rc, _, err = cli(
        capsys,
        "bench",
        "--prompts",
        "demo",
        "--limit",
        "1",
        "--drafter",
        "ngram",
        "--drafter",
        str(FIXTURES / "dflash"),
        "--max-new-tokens",
        "2",
        "--db",
        str(db),
    )
    assert_one_error(rc, err, "hidden size 64 does not match the verifier's 576")
    assert Store(db).list_runs() == []  # every drafter loads before the baseline decodes


TRAIN_CASES = {
    "steps-zero": (["--steps", "0"], "steps must be a positive integer, got 0"),
    "max-new-zero": (["--max-new-tokens", "0"], "max-new-tokens must be a positive integer, got 0"),
    "max-new-negative": (
        ["--max-new-tokens", "-1"],
        "max-new-tokens must be a positive integer, got -1",
    ),
    "lr-negative": (["--lr", "-1"], "lr must be > 0"),
    "seed-not-int": (["--seed", "zero"], "argument --seed: invalid int value: 'zero'"),
    "block-size-one": (["--block-size", "1"], "block-size must be >= 2"),
    "unknown-algorithm": (["--algorithm", "medusa"], "unknown algorithm 'medusa'"),
}


@pytest.mark.parametrize("case", TRAIN_CASES)
def test_cli_train_bad_setting_writes_nothing(capsys, tmp_path, case):
    args, message = TRAIN_CASES[case]
    out = tmp_path / "out"
    rc, _, err = cli(
        capsys, "train", "--algorithm", "dflash", "--prompts", "demo", "--out", str(out), *args
    )
    assert_one_error(rc, err, message)
    assert not out.exists()


@pytest.mark.parametrize("case", ["empty-file", "not-utf8"])
def test_cli_train_unusable_prompt_file(capsys, tmp_path, embedded_verifier, case):
    path = tmp_path / "set.jsonl"
    path.write_bytes(PROMPT_FILE_CASES[case][0])
    out = tmp_path / "out"
    rc, _, err = cli(
        capsys,
        "train",
        "--algorithm",
        "dflash",
        "--prompts",
        str(path),
        "--out",
        str(out),
        "--steps",
        "1",
        "--no-progress",
    )
    # Training prints its stages ("loading verifier ...") on stderr before it meets the file.
    progress, error = err.strip().splitlines()[:-1], err.strip().splitlines()[-1]
    assert all(not line.startswith("specui: error") for line in progress)
    assert_one_error(rc, error, "has no usable rows")
    assert PROMPT_FILE_CASES[case][1] in error
    assert [p for p in out.rglob("*") if p.is_file()] == []  # no half-written checkpoint or metrics


RUNS_CASES = {
    "show-not-int": (["runs", "show", "three"], "argument run_id: invalid int value: 'three'"),
    "show-missing": (["runs", "show", "999"], "999"),
    "export-steps-without-runs": (
        ["runs", "export", "--csv", "-", "--steps"],
        "--steps needs --runs",
    ),
    "export-missing-run": (["runs", "export", "--csv", "-", "--runs", "999"], "999"),
}


@pytest.mark.parametrize("case", RUNS_CASES)
def test_cli_runs_bad_input(capsys, tmp_path, case):
    args, message = RUNS_CASES[case]
    db = tmp_path / "s.db"
    Store(db).close()
    rc, _, err = cli(capsys, *args, "--db", str(db))
    assert_one_error(rc, err, message)


def test_library_errors_are_specui_errors():
    # The messages above come from the library, not the surfaces: the same checks hold for scripts.
    from specui.service import DecodeRequest
    from specui.trace import SamplingParams

    for bad in (
        dict(max_new_tokens=0),
        dict(seed="x"),
        dict(num_speculative_tokens=0),
        dict(seed=-1),
    ):
        with pytest.raises(SpecUIError):
            DecodeRequest(drafter="ngram", **bad)
    with pytest.raises(SpecUIError, match="temperature"):
        SamplingParams(temperature=float("inf"))
    assert SamplingParams(temperature="0.5", top_k=3.0) == SamplingParams(temperature=0.5, top_k=3)


# === the app's API ==========================================================================


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """One real app for the module (never one per case); broken folders go into its data dir,
    the only folders the API lets a visitor name."""
    data = tmp_path_factory.mktemp("appdata")
    specs = data / "speculators"
    specs.mkdir()
    for case in BROKEN_FOLDERS:
        broken_folder(specs, case)
    shutil.copytree(FIXTURES / "dflash", specs / "other-verifier")
    shutil.copytree(FIXTURES / "verifier", data / "verifier")  # the broken folders' own verifier
    with running_app(data) as url:
        from gradio_client import Client

        yield Client(url, verbose=False), data


def _api_error(client, api_name: str, *args) -> str:
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as info:
        client.predict(*args, api_name=api_name)
    return str(info.value)


def _runs(data: Path) -> list:
    with Store(data / "specui.db") as store:
        return store.list_runs()


def _temp_files(data: Path) -> list[Path]:
    return [
        p
        for p in data.rglob("*")
        if p.name.endswith(".tmp")
        or p.name.startswith(".model.safetensors.")
        or p.name.startswith(".config.json.")
    ]


GOOD = "Repeat: red green blue."
# /decode takes (prompt, drafter, verifier, K, max_new_tokens, temperature, seed, chat).
DECODE_CASES = {
    "empty": (("", "ngram", "embedded", 0, 2, 0.0, 0, True), "the prompt is empty"),
    "whitespace": (("  \n\t", "ngram", "embedded", 0, 2, 0.0, 0, True), "the prompt is empty"),
    "not-text": ((None, "ngram", "embedded", 0, 2, 0.0, 0, True), "the prompt must be text"),
    "over-context": (
        (OVER_CONTEXT, "ngram", "embedded", 0, 2, 0.0, 0, True),
        "the verifier's context window is 8192",
    ),
    "over-context-raw": (
        (OVER_CONTEXT, "ngram", "embedded", 0, 2, 0.0, 0, False),
        "the verifier's context window is 8192",
    ),
    "over-cap": (
        (OVER_CAP, "ngram", "embedded", 0, 2, 0.0, 0, True),
        f"the limit is {MAX_PROMPT_CHARS:,}",
    ),
    "nul-bytes": (("a\x00b", "ngram", "embedded", 0, 2, 0.0, 0, True), "contains NUL bytes"),
    "only-special": (
        ("<|im_end|>", "ngram", "embedded", 0, 2, 0.0, 0, True),
        "only special tokens",
    ),
    "only-special-raw": (
        ("<|endoftext|>", "ngram", "embedded", 0, 2, 0.0, 0, False),
        "only special tokens",
    ),
    "k-negative": ((GOOD, "ngram", "embedded", -1, 2, 0.0, 0, True), "must be in 1..256, got -1"),
    "k-10000": (
        (GOOD, "ngram", "embedded", 10_000, 2, 0.0, 0, True),
        "must be in 1..256, got 10000",
    ),
    "k-not-int": (
        (GOOD, "ngram", "embedded", "four", 2, 0.0, 0, True),
        "number of speculative tokens (K) must be an integer",
    ),
    "temperature-negative": (
        (GOOD, "ngram", "embedded", 0, 2, -1.0, 0, True),
        "temperature must be >= 0",
    ),
    "temperature-not-number": (
        (GOOD, "ngram", "embedded", 0, 2, "hot", 0, True),
        "temperature must be a number",
    ),
    "max-new-zero": (
        (GOOD, "ngram", "embedded", 0, 0, 0.0, 0, True),
        "max_new_tokens must be >= 1, got 0",
    ),
    "max-new-negative": (
        (GOOD, "ngram", "embedded", 0, -5, 0.0, 0, True),
        "max_new_tokens must be >= 1, got -5",
    ),
    "max-new-huge": (
        (GOOD, "ngram", "embedded", 0, 10**6, 0.0, 0, True),
        "more than the verifier's context window",
    ),
    "seed-not-int": (
        (GOOD, "ngram", "embedded", 0, 2, 0.0, "abc", True),
        "seed must be an integer, got 'abc'",
    ),
    "seed-float": (
        (GOOD, "ngram", "embedded", 0, 2, 0.0, 1.5, True),
        "seed must be an integer, got 1.5",
    ),
    "seed-negative": ((GOOD, "ngram", "embedded", 0, 2, 0.0, -1, True), "seed must be in"),
    "unknown-drafter": (
        (GOOD, "no-such-drafter", "embedded", 0, 2, 0.0, 0, True),
        "'no-such-drafter' is neither a known name",
    ),
    "drafter-outside": ((GOOD, "/etc", "embedded", 0, 2, 0.0, 0, True), "lies outside the folders"),
}


@pytest.mark.parametrize("case", DECODE_CASES)
def test_api_decode_bad_input(app, case):
    client, data = app
    args, message = DECODE_CASES[case]
    before = len(_runs(data))
    error = _api_error(client, "/decode", *args)
    assert message in error
    assert str(data) not in error  # a visitor is not told the server's folders
    runs = _runs(data)
    assert len(runs) == before  # refused before a run row was made
    assert not [r for r in runs if str(r.status) == "running"]


def test_api_decode_lone_surrogate(app):
    # gradio_client cannot send a lone surrogate (httpx encodes UTF-8); a raw JSON escape can.
    import httpx

    client, data = app
    before = len(_runs(data))
    body = '{"data": ["caf\\udcc3", "ngram", "embedded", 0, 2, 0.0, 0, true]}'
    base = client.src.rstrip("/") + "/gradio_api/call/decode"
    event = httpx.post(
        base, content=body, headers={"content-type": "application/json"}, timeout=60
    ).json()["event_id"]
    stream = httpx.get(f"{base}/{event}", timeout=120).text
    assert "event: error" in stream and "not valid UTF-8" in stream, stream
    assert len(_runs(data)) == before


@pytest.mark.parametrize("case", [*BROKEN_FOLDERS, "other-verifier"])
def test_api_decode_broken_speculator_folder(app, case):
    client, data = app
    folder = data / "speculators" / (case if case == "other-verifier" else f"broken-{case}")
    before_files, before_runs = tree(folder), len(_runs(data))
    message = (
        "hidden size 64 does not match the verifier's 576"
        if case == "other-verifier"
        else BROKEN_FOLDERS[case][1]
    )
    # The fixture verifier for the folders made for it (the drafter loads before the text is
    # encoded, so its lack of a tokenizer never shows); SmolLM2 for the other.
    verifier = "embedded" if case == "other-verifier" else str(data / "verifier")
    text = _api_error(client, "/decode", GOOD, str(folder), verifier, 0, 2, 0.0, 0, True)
    assert message in text and "cannot load drafter" in text
    assert tree(folder) == before_files
    assert len(_runs(data)) == before_runs


# /bench takes (drafter, prompts, limit, max_new_tokens, verifier, K, temperature, seed).
BENCH_API_CASES = {
    "unknown-set": (
        ("ngram", "no-such-set", 1, 2, "embedded", 0, 0.0, 0),
        "unknown prompt set 'no-such-set'",
    ),
    "file-path": (("ngram", "/etc/passwd", 1, 2, "embedded", 0, 0.0, 0), "unknown prompt set"),
    "limit-zero": (("ngram", "demo", 0, 2, "embedded", 0, 0.0, 0), "limit must be in 1..8"),
    "limit-not-int": (
        ("ngram", "demo", "all", 2, "embedded", 0, 0.0, 0),
        "limit must be an integer",
    ),
    "max-new-zero": (
        ("ngram", "demo", 1, 0, "embedded", 0, 0.0, 0),
        "max_new_tokens must be in 1..256",
    ),
    "k-negative": (("ngram", "demo", 1, 2, "embedded", -2, 0.0, 0), "must be in 1..256, got -2"),
    "temperature-negative": (
        ("ngram", "demo", 1, 2, "embedded", 0, -3.0, 0),
        "temperature must be >= 0",
    ),
    "seed-not-int": (("ngram", "demo", 1, 2, "embedded", 0, 0.0, "abc"), "seed must be an integer"),
    "empty-drafter": (("", "demo", 1, 2, "embedded", 0, 0.0, 0), "name a drafter"),
}


@pytest.mark.parametrize("case", BENCH_API_CASES)
def test_api_bench_bad_input(app, case):
    client, data = app
    args, message = BENCH_API_CASES[case]
    before = len(_runs(data))
    assert message in _api_error(client, "/bench", *args)
    assert len(_runs(data)) == before


def test_api_bench_broken_speculator_leaves_no_running_run(app):
    client, data = app
    folder = data / "speculators" / "broken-nan-weights"
    text = _api_error(
        client, "/bench", str(folder), "demo", 1, 2, str(data / "verifier"), 0, 0.0, 0
    )
    assert "contains NaN or infinity" in text
    assert not [r for r in _runs(data) if str(r.status) == "running"]


@pytest.mark.parametrize(
    ("api_name", "ids", "message"),
    [
        ("/compare", "one two", "run ids must be integers"),
        ("/compare", "  ", "give at least one run id"),
        ("/compare", "987654", "987654"),
        ("/export", "1;2", "run ids must be integers"),
        ("/export", "", "give at least one run id"),
        ("/export", "987654", "987654"),
    ],
)
def test_api_compare_and_export_bad_ids(app, api_name, ids, message):
    client, _ = app
    assert message in _api_error(client, api_name, ids)


def test_api_still_decodes_after_the_bad_calls_and_left_nothing_behind(app):
    # Runs last in the module (pytest keeps file order): every bad call above has been made.
    client, data = app
    out = client.predict(GOOD, "ngram", "embedded", 4, 6, 0.0, 0, True, api_name="/decode")
    assert len(out["output_token_ids"]) == 6
    runs = _runs(data)
    assert str(next(r for r in runs if r.id == out["run_id"]).status) == "done"
    assert not [r for r in runs if str(r.status) == "running"]
    # Only the good calls (and the plain baseline of the bench whose drafter failed to load)
    # stored runs.
    assert all(str(r.status) == "done" for r in runs)
    assert _temp_files(data) == []
