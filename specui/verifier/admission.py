"""Memory admitted before a model load: estimate a load's size, refuse what does not fit.

Every verifier and drafter load (a local folder, a ``.gguf`` file, a hub id) first estimates
its peak resident size from the weights' headers (safetensors headers, GGUF tensor infos, or
the hub's metadata: ``specui.verifier.hub``) and is admitted only if that fits in the memory
free now, less a margin (``SPECUI_MEMORY_MARGIN_MB``, default 512) and less what other loads
admitted but not yet resident will take.  The operator may also cap any one model
(``SPECUI_MAX_MODEL_GB``; app.py ``--max-model-gb``).  A refusal says what would fit.

An estimate, not a measurement: the weights as computed in float32, plus the stored copy a
load holds for a moment while converting (see ``peak_bytes``).  Config-only overheads (a KV
cache, activations) are small beside the weights of any model worth refusing.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specui.errors import SpecUIError

MARGIN_ENV = "SPECUI_MEMORY_MARGIN_MB"
MAX_MODEL_ENV = "SPECUI_MAX_MODEL_GB"
GB = 1e9

# Bytes per element of the safetensors dtypes a checkpoint may store.
_DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
    "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip


@dataclass(frozen=True)
class Weights:
    """What a checkpoint's headers say: its element count and the bytes it stores them in."""

    elements: int
    stored_bytes: int
    # Where a load knows better than the float32 rule below (a drafter: its serving copies and
    # conversions, ``specui.algorithms.serving.load_weights``), its own figures.
    resident: int | None = None
    peak: int | None = None

    def __add__(self, other: Weights) -> Weights:
        return Weights(self.elements + other.elements, self.stored_bytes + other.stored_bytes)

    @property
    def resident_bytes(self) -> int:
        """Held once loaded: SpecUI computes in float32 (bf16 verification keeps less)."""
        return self.elements * 4 if self.resident is None else self.resident

    @property
    def peak_bytes(self) -> int:
        """Held at the worst moment of a load: the float32 weights and the stored copy they
        are converted from (a bf16 checkpoint read into float32, a GGUF dequantized)."""
        return self.resident_bytes + self.stored_bytes if self.peak is None else self.peak


def header_weights(header: dict) -> Weights:
    """The weights a safetensors header describes (``__metadata__`` skipped)."""
    elements = stored = 0
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        n = 1
        for dim in info.get("shape", ()):
            n *= int(dim)
        elements += n
        stored += n * _DTYPE_BYTES.get(str(info.get("dtype")), 4)
    return Weights(elements, stored)


def safetensors_weights(path: Path) -> Weights:
    """The weights of one local ``.safetensors`` file, from its header only (no tensor read)."""
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > 100 * 2**20:  # the format caps headers at 100 MB
                raise ValueError("header too large")
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error) as e:
        raise SpecUIError(f"{path.name} is not a readable safetensors file ({e})") from None
    return header_weights(header)


def folder_weights(folder: Path) -> Weights:
    """The weights a load of ``folder`` reads: the shards its ``model.safetensors.index.json``
    names, else ``model.safetensors``, else every ``.safetensors`` file (none: zero)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise SpecUIError(f"{index.name} is not a readable index ({e})") from None
        paths = [folder / Path(name).name for name in names]
    elif (folder / "model.safetensors").is_file():
        paths = [folder / "model.safetensors"]
    else:
        paths = sorted(folder.glob("*.safetensors"))
    total = Weights(0, 0)
    for path in paths:
        total += safetensors_weights(path)
    return total


def gguf_weights(path: Path) -> Weights:
    """A GGUF file's weights from its tensor infos (the file is mapped, not read)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except (OSError, ValueError) as e:
        raise SpecUIError(f"{path.name} is not a readable GGUF file ({e})") from None
    elements = sum(int(t.n_elements) for t in reader.tensors)
    return Weights(elements, path.stat().st_size)


# --- free memory ---------------------------------------------------------------------------


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available() -> int | None:
    """What a container's memory limit leaves (cgroup v2, then v1); None without a limit."""
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            cap = Path(limit).read_text().strip()
            used = int(Path(usage).read_text().strip())
        except (OSError, ValueError):
            continue
        if cap == "max" or int(cap) >= 2**60:  # v1 writes "no limit" as a huge number
            return None
        return max(0, int(cap) - used)
    return None


def free_bytes() -> int:
    """Memory a new load may take now: the smaller of the system's available memory and what
    the container's limit leaves (a Space's limit is its container's)."""
    found = [b for b in (_meminfo_available(), _cgroup_available()) if b is not None]
    if not found:
        import psutil

        found = [psutil.virtual_memory().available]
    return min(found)


def margin_bytes() -> int:
    return int(float(os.environ.get(MARGIN_ENV, "512")) * 2**20)


def max_model_bytes() -> int | None:
    """The operator's cap on any one model's resident size (None: only free memory caps)."""
    value = os.environ.get(MAX_MODEL_ENV, "").strip()
    return int(float(value) * GB) if value else None


# --- admission -----------------------------------------------------------------------------

_lock = threading.Lock()
_reserved: dict[int, int] = {}  # admitted loads not yet done: id -> bytes


def size_text(n: float) -> str:
    """Bytes as a visitor reads them: GB, or MB below one GB."""
    return f"{n / GB:.1f} GB" if n >= GB else f"{n / 1e6:.0f} MB"


def _pending() -> int:
    with _lock:
        return sum(_reserved.values())


def room_bytes(pending: int | None = None) -> int:
    """What the next load may take: free memory less the margin and the pending loads."""
    pending = _pending() if pending is None else pending
    return max(0, free_bytes() - margin_bytes() - pending)


def refusal(what: str, weights: Weights, room: int) -> str | None:
    """Why a load of ``weights`` is refused with ``room`` bytes to spare (None: admitted)."""
    cap = max_model_bytes()
    if cap is not None and weights.resident_bytes > cap:
        return (
            f"{what} needs about {size_text(weights.resident_bytes)}, over this app's cap of"
            f" {size_text(cap)} per model (the operator sets it: --max-model-gb,"
            f" {MAX_MODEL_ENV})"
        )
    if weights.peak_bytes > room:
        # A float32 checkpoint peaks at twice its resident size (stored copy + float32 copy).
        return (
            f"not enough memory to load {what}: it needs about {size_text(weights.peak_bytes)}"
            f" while loading, and {size_text(room)} is free beside the models loaded or loading"
            f" (less a {size_text(margin_bytes())} margin); a model of up to about"
            f" {size_text(room / 2)} of float32 weights would fit"
        )
    return None


def check_fits(what: str, weights: Weights) -> None:
    """Refuse, with a message that says what would fit, a load of ``weights`` over the
    operator's cap or over the memory free now."""
    message = refusal(what, weights, room_bytes())
    if message is not None:
        raise SpecUIError(message)


@contextmanager
def admitted(what: str, weights: Weights) -> Iterator[None]:
    """Hold ``weights.peak_bytes`` for a load while it runs; refuse it (``check_fits``) first.

    Checked and reserved as one step, so two loads started at once do not both count on the
    same free memory; released when the load ends (its memory is then resident, or freed)."""
    token = object()
    with _lock:
        message = refusal(what, weights, room_bytes(sum(_reserved.values())))
        if message is None:
            _reserved[id(token)] = weights.peak_bytes
    if message is not None:
        raise SpecUIError(message)
    try:
        yield
    finally:
        with _lock:
            _reserved.pop(id(token), None)
