"""The skip mark of the real-vLLM tests."""

from __future__ import annotations

import os

import pytest


def vllm_missing() -> bool:
    """Whether no vLLM install is found (``.venv-vllm`` or ``$SPECUI_VLLM_PYTHON``)."""
    from specui.errors import SpecUIError
    from specui.vllm.install import vllm_python

    try:
        vllm_python()
    except SpecUIError:
        return True
    return False


# The real-vLLM tests: skipped where vLLM is not installed, never in CI (which installs it).
needs_vllm = pytest.mark.skipif(
    vllm_missing() and not os.environ.get("CI"),
    reason=(
        "vLLM is not installed (.venv-vllm is missing: run `bash scripts/setup_vllm.sh`) and CI is"
        " unset"
    ),
)
