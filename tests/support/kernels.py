"""The skip mark of the tests that need SpecUI's CPU kernels built and run here."""

from __future__ import annotations

import pytest

from specui.kernels import build


def runnable() -> bool:
    """Whether this CPU runs the kernels and a C compiler can build them."""
    return build.cpu_reason() is None and build.compiler() is not None


needs_kernel = pytest.mark.skipif(not runnable(), reason="no AVX512-VNNI CPU or no C compiler here")
