"""Launching a real vLLM server for a test module and stopping it when the module ends."""

from __future__ import annotations

from pathlib import Path

from specui.vllm.server import ServerConfig


def launch(request, work: Path, name: str, **kw):
    """A real vLLM server (log in ``work/NAME.log``), stopped by the requesting fixture's
    finalizer so a failed test never leaves one running."""
    from specui.vllm.server import VLLMServer

    server = VLLMServer.launch(
        ServerConfig(log_path=str(work / f"{name}.log"), startup_timeout_s=420, **kw)
    )
    request.addfinalizer(server.stop)
    return server
