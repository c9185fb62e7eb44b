"""The "bench" job kind: the dashboard's "launch a benchmark", run by a worker process.

Kept apart from ``specui.benchmark`` so registering the kind (every runner
start) does not import torch and transformers; the job imports them itself.
"""

from __future__ import annotations

from specui.jobs import JobContext, job_kind


@job_kind("bench")
def bench_job(params: dict, ctx: JobContext) -> dict:
    """params: verifier, drafters, prompts, limit, max_new_tokens, temperature,
    num_speculative_tokens, seed."""
    import torch

    from specui.benchmark import bench
    from specui.trace import SamplingParams

    torch.set_num_threads(int(params.get("threads", 1)))
    store = ctx.store

    def progress(message: str, fraction: float) -> None:
        ctx.log(message)
        ctx.progress(fraction, message)

    result = bench(
        store,
        verifier=params.get("verifier", "embedded"),
        drafters=list(params.get("drafters", [])),
        prompts=params.get("prompts", "demo"),
        limit=params.get("limit"),
        max_new_tokens=int(params.get("max_new_tokens", 96)),
        sampling=SamplingParams(temperature=float(params.get("temperature", 0.0))),
        num_speculative_tokens=params.get("num_speculative_tokens"),
        seed=int(params.get("seed", 0)),
        owner=params.get("owner"),
        progress=progress,
        should_stop=ctx.cancelled,
    )
    return {"run_ids": result.run_ids}
