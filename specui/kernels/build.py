"""Building SpecUI's CPU kernels: every C file of this package (``*.c``, with ``kernels.h``)
compiled into one shared library with the system's C compiler (``$CC``, else ``cc``/``gcc``),
under a name that hashes the sources, the flags and the compiler; and what the CPU must have to
run it.  A C file added to this folder is built in with no change here.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

FOLDER = Path(__file__).parent
FLAGS = (
    "-O3",
    "-mavx512f",
    "-mavx512bw",
    "-mavx512vl",
    "-mavx512vnni",
    "-mavx512bf16",
    "-mamx-tile",
    "-mamx-bf16",
    "-mamx-int8",
    "-shared",
    "-fPIC",
)
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
AMX_FLAGS = (
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)  # the AMX matmuls; without them bf16 stays oneDNN's


def sources() -> list[Path]:
    """The C files compiled into the library, in a fixed order."""
    return sorted(FOLDER.glob("*.c"))


def _source_bytes() -> bytes:
    """Every C file and header by name and content: a change to any of them is a new library."""
    files = sorted([*FOLDER.glob("*.c"), *FOLDER.glob("*.h")])
    return b"".join(f.name.encode() + b"\0" + f.read_bytes() for f in files)


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux ``/proc/cpuinfo``); empty where they cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((ln for ln in text.splitlines() if ln.startswith("flags")), "").split())


def cpu_reason() -> str | None:
    """Why this CPU cannot run the kernels, or None (Linux ``/proc/cpuinfo`` flags)."""
    flags = cpu_flags()
    if not flags:
        return "no /proc/cpuinfo flags to read the CPU's features from"
    missing = [f for f in CPU_FLAGS if f not in flags]
    return f"the CPU lacks {', '.join(missing)}" if missing else None


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


def build(folder: Path, cc: str | None = None) -> Path:
    """The kernels' shared library under ``folder``, compiled unless already there.

    Raises ``RuntimeError`` with the compiler's words when it cannot be built."""
    cc = cc or compiler()
    if cc is None or shutil.which(cc) is None:
        raise RuntimeError(f"no C compiler ({cc or 'set CC, or install cc/gcc'})")
    try:
        version = subprocess.run(
            [cc, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"C compiler {cc} does not run: {e}") from e
    key = hashlib.sha256(_source_bytes() + " ".join(FLAGS).encode() + version.encode()).hexdigest()[
        :16
    ]
    library = folder / f"kernels-{key}.so"
    if library.exists():
        return library
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".kernels-", suffix=".so")
    os.close(fd)
    try:
        files = sources()
        command = [cc, *FLAGS, *(str(f) for f in files), "-o", tmp]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            names = ", ".join(f.name for f in files)
            raise RuntimeError(f"{cc} could not build {names}: {done.stderr.strip()[-500:]}")
        os.replace(tmp, library)  # atomic: a concurrent build or a kill leaves no half file
    finally:
        Path(tmp).unlink(missing_ok=True)
    return library
