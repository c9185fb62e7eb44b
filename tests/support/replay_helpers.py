"""Store a vLLM-style run the way ``specui.vllm.bench.run_benchmark`` does
(``steps_from_request`` -> ``RunRecorder.add_result`` -> the run's measured
settings), without a vLLM server: the requests' metrics are given here as vLLM
would report them.  Shared by tests/decoding/test_replay.py and tests/ui/test_app.py."""

from __future__ import annotations

from specui.store import Backend, DecodingSettings, RunRecorder, Store
from specui.trace import GenerationResult, StepTrace
from specui.vllm.client import RequestResult
from specui.vllm.request_steps import TokenTexts, steps_from_request
from specui.vllm.stored_run import VLLMRun, store_measurements


def per_step_request(
    index: int, prompt_ids: list[int], output: list[int], accepted: list[int], k: int
) -> RequestResult:
    """A request whose response carried vLLM's ordered per-step counts."""
    per_step = {"per_step_accepted": list(accepted), "per_step_drafted": [k] * len(accepted)}
    spec = {**per_step, "num_spec_steps": len(accepted), "num_spec_tokens": k}
    return _request(index, prompt_ids, output, spec)


def histogram_request(
    index: int, prompt_ids: list[int], output: list[int], histogram: list[int]
) -> RequestResult:
    """A request whose response carried only the per-request acceptance histogram."""
    counts = {"num_spec_steps": sum(histogram), "num_spec_tokens": len(histogram) - 1}
    return _request(index, prompt_ids, output, {"acceptance_histogram": list(histogram), **counts})


def _request(index: int, prompt_ids: list[int], output: list[int], spec: dict) -> RequestResult:
    """A finished ("length") request with these output tokens and speculative metrics."""
    return RequestResult(
        index, prompt_ids, output_token_ids=list(output), finish_reason="length", spec=spec
    )


def store_vllm_style_run(
    store: Store,
    requests: list[tuple[str, RequestResult]],
    *,
    k: int,
    texts: TokenTexts,
    verifier: str = "SmolLM2-135M-Instruct",
) -> tuple[int, list[list[StepTrace]]]:
    """Record ``requests`` (prompt text, request) as one backend-vllm run; returns
    the run id and each request's steps as ``steps_from_request`` built them."""
    info = {
        "server": "attached",
        "base_url": "http://127.0.0.1:1",
        "model": verifier,
        "speculative_config": None,
        "command_line": None,
        "api": "completions",
        "concurrency": 1,
        "ignore_eos": False,
    }
    run = store.create_run(
        verifier=verifier,
        prompt_set="replay-test",
        algorithm="dflash",
        drafter="dflash-replay",
        backend=Backend.VLLM,
        settings=DecodingSettings(
            num_speculative_tokens=k, max_new_tokens=64, extra={"vllm": info, "concurrency": 1}
        ),
    )
    assert run.id is not None
    sources: set[str] = set()
    all_steps = []
    with RunRecorder(store, run.id) as rec:
        for i, (text, res) in enumerate(requests):
            steps, source = steps_from_request(res, texts)
            sources.add(source)
            rec.add_result(
                i,
                text,
                GenerationResult(
                    prompt_token_ids=res.prompt_token_ids,
                    output_token_ids=res.output_token_ids,
                    output_text=res.output_text,
                    steps=steps,
                    stop_reason="max_tokens",
                    wall_time_s=0.5,
                    num_speculative_tokens=k,
                ),
            )
            all_steps.append(steps)
    tokens = sum(len(r.output_token_ids) for _, r in requests)
    store_measurements(
        store,
        run.id,
        info,
        VLLMRun(
            run_id=run.id,
            num_prompts=len(requests),
            num_output_tokens=tokens,
            elapsed_s=1.0,
            aggregate_tokens_per_s=float(tokens),
            ttft_ms={},
            itl_ms={},
            counters=None,
            step_source="+".join(sorted(sources)),
        ),
    )
    return run.id, all_steps
