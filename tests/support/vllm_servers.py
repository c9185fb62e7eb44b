"""Launching a real vLLM server for a test module and stopping it when the module ends."""

from __future__ import annotations

from pathlib import Path

from specui.vllm.launch_plan import ServerConfig


def launch(request, work: Path, name: str, **kw):
    """A real vLLM server (log in ``work/NAME.log``), stopped by the requesting fixture's
    finalizer so a failed test never leaves one running."""
    from specui.vllm.server import VLLMServer

    server = VLLMServer.launch(
        ServerConfig(log_path=str(work / f"{name}.log"), startup_timeout_s=420, **kw)
    )
    request.addfinalizer(server.stop)
    return server


def bench(store, server, prompts, prompt_set: str, **settings):
    """``run_benchmark`` of ``prompts`` (the set ``prompt_set``) on ``server`` serving the
    embedded verifier, stored in ``store``; ``settings`` are BenchSettings'."""
    from specui.vllm.bench import run_benchmark
    from specui.vllm.client import BenchSettings

    kw = dict(prompt_set=prompt_set, verifier="embedded", settings=BenchSettings(**settings))
    return run_benchmark(store, server, prompts, **kw)
