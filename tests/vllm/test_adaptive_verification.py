"""vLLM's adaptive verification: turned on in the speculative config where the installed vLLM
declares the field, refused with the reason where it does not.  The environments here are
folders laid out as a virtualenv with vLLM's config source; nothing of vLLM runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from specui.errors import SpecUIError
from specui.vllm.install import (
    ADAPTIVE_VERIFICATION,
    accepts_speculative_field,
    with_adaptive_verification,
)
from specui.vllm.launch_plan import ServerConfig

NEWER = f"""class SpeculativeConfig:
    num_speculative_tokens: int | None = None
    {ADAPTIVE_VERIFICATION}: bool = False
"""
OLDER = """class SpeculativeConfig:
    num_speculative_tokens: int | None = None
    # a comment naming enable_adaptive_verification is not a field
"""


def _venv(root: Path, speculative_source: str) -> Path:
    site = root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    config = site / "site-packages" / "vllm" / "config"
    config.mkdir(parents=True)
    (config.parent / "__init__.py").write_text("")
    (config / "speculative.py").write_text(speculative_source)
    python = root / "bin" / "python"
    python.parent.mkdir()
    python.write_text("")
    return python


def test_a_vllm_that_declares_the_field_gets_it_on(tmp_path):
    python = _venv(tmp_path / "new", NEWER)
    assert accepts_speculative_field(python, ADAPTIVE_VERIFICATION)
    spec = {"method": "ngram", "num_speculative_tokens": 4}
    on = with_adaptive_verification(spec, python)
    assert on == {**spec, ADAPTIVE_VERIFICATION: True}
    assert ADAPTIVE_VERIFICATION not in spec  # the caller's config is not changed


def test_a_vllm_without_the_field_is_refused_with_the_reason(tmp_path):
    python = _venv(tmp_path / "old", OLDER)
    assert not accepts_speculative_field(python, ADAPTIVE_VERIFICATION)
    with pytest.raises(SpecUIError, match=f"no `{ADAPTIVE_VERIFICATION}`.*upgrade vLLM"):
        with_adaptive_verification({"method": "ngram"}, python)


def test_the_server_config_is_off_unless_asked():
    assert ServerConfig().adaptive_verification is False
