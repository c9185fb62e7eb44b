"""Where the repository and the committed reference fixtures are."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The speculators 0.9.0 reference set is committed with the tests (regenerate or check it with
# scripts/make_fixtures.py); SPECUI_FIXTURES points the suite at another set of the same layout.
FIXTURES = Path(
    os.environ.get("SPECUI_FIXTURES") or REPO / "tests" / "fixtures" / "speculators-0.9.0"
)
