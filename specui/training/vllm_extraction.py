"""Training's one seam to vLLM: finding its interpreter, checking an extraction can run, and the
extractor whose server computes the verifier's hidden states (``--extractor vllm``).

Every name training uses of ``specui.vllm`` is imported here; the config, the loop and its
stages see three functions.  ``TrainConfig`` looks up the interpreter as it is made, and the
CLI and the UI import it at start: so this module imports the server and the extractor
(``specui.vllm.server`` and ``.extract``, which import torch) only when a function needs them
(measured: 0.1 s to import the config without them, 4-5 s with them).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from specui.vllm.install import check_installed, is_cpu_build, vllm_python

if TYPE_CHECKING:
    from specui.data.hidden import HiddenStateExtractor
    from specui.vllm.server import VLLMServer


def find_python(python: str | None) -> Path:
    """vLLM's interpreter: ``python``, else ``$SPECUI_VLLM_PYTHON``, else .venv-vllm (an error
    names where it looked)."""
    return vllm_python(python)


def check_extraction(verifier_choice: str, python: str | None) -> None:
    """Refuse an extraction vLLM cannot run: a verifier it does not serve (a .gguf file), or
    no vLLM in its interpreter."""
    from specui.vllm.launch_plan import resolve_model  # torch: see the module's docstring

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
    from specui.vllm.extract import VLLMExtractor  # torch: see the module's docstring
    from specui.vllm.launch_plan import ServerConfig

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
