"""The skip mark of the tests that need SpecUI's CPU kernels built and run here.

Not `kernels.py`: tests/support is on sys.path when `ddp_train.py` runs there, and transformers
imports the `kernels` package of the hub by that name."""

from __future__ import annotations

import pytest

from specui.kernels import build


def runnable() -> bool:
    """Whether this CPU runs the kernels and a C compiler can build them."""
    return build.cpu_reason() is None and build.compiler() is not None


needs_kernel = pytest.mark.skipif(not runnable(), reason="no AVX512-VNNI CPU or no C compiler here")
