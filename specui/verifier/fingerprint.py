"""The weights fingerprint: 16 hex digits that name a verifier's weights.

Why not specui.data.distill.verifier_fingerprint (the self-distillation cache key): that one
hashes the config's JSON, which carries the folder the model was loaded from and the
transformers version, so the same weights copied elsewhere or read after an upgrade would
count as another verifier.  This one reads only the weights, so a loaded model and its
safetensors files give the same value (vLLM runs get it from the served folder).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from specui.errors import SpecUIError
from specui.verifier.embedded import EMBEDDED, embedded_folder

FINGERPRINT_VALUES = 4096  # the first values of each tensor (a fine-tune moves them all)


def _tensor_digest(shape: Iterable[int], first: torch.Tensor) -> bytes:
    # float32 (int64) values: a bf16 file and its float32 load hold the same numbers.
    values = first.to(torch.float32 if first.is_floating_point() else torch.int64).contiguous()
    h = hashlib.sha256(repr(tuple(int(d) for d in shape)).encode())
    h.update(values.numpy().tobytes())
    return h.digest()


def _combine(digests: list[bytes]) -> str:
    # Sorted, not keyed by name: a checkpoint's tensor names can differ from the loaded
    # model's (renamed legacy keys), and a tied LM head is one tensor in both.
    return hashlib.sha256(b"".join(sorted(digests))).hexdigest()[:16]


def model_fingerprint(model: nn.Module) -> str:
    """16 hex digits from the shape and first ``FINGERPRINT_VALUES`` values of every weight
    tensor (parameters and persistent buffers; a tied tensor once)."""
    persistent = set(model.state_dict(keep_vars=True))
    seen: set[int] = set()
    digests = []
    named = [
        *model.named_parameters(),
        *((n, b) for n, b in model.named_buffers() if n in persistent),
    ]
    for name, t in named:
        if t.is_meta:
            raise ValueError(
                f"{name} has no values (a bf16-switched model): fingerprint it before"
                " batch_invariant.enable"
            )
        if id(t) in seen:
            continue
        seen.add(id(t))
        with torch.no_grad():
            digests.append(
                _tensor_digest(t.shape, t.detach().reshape(-1)[:FINGERPRINT_VALUES].cpu())
            )
    return _combine(digests)


def folder_fingerprint(folder: str | os.PathLike[str]) -> str | None:
    """``model_fingerprint`` of the model in an HF folder, read from its safetensors files
    without loading the model (a few KiB per tensor).  None when the folder has none."""
    from safetensors import SafetensorError, safe_open

    folder = Path(folder).expanduser()
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise SpecUIError(f"cannot read the safetensors index {index}: {e}") from None
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        return None
    digests = []
    try:
        for file in files:
            with safe_open(str(folder / file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    shape = f.get_slice(name).get_shape()
                    digests.append(_tensor_digest(shape, _first_values(f, name, shape)))
    except (OSError, ValueError, SafetensorError) as e:  # a truncated or foreign file
        raise SpecUIError(f"cannot read the weights in {folder}: {e}") from None
    return _combine(digests)


def _first_values(f, name: str, shape: list[int]) -> torch.Tensor:
    """The first FINGERPRINT_VALUES values of a stored tensor (flattened), reading only the
    leading rows that hold them."""
    if not shape:
        return f.get_tensor(name).reshape(-1)
    row = math.prod(shape[1:])
    rows = shape[0] if row == 0 else min(shape[0], -(-FINGERPRINT_VALUES // row))
    return f.get_slice(name)[:rows].reshape(-1)[:FINGERPRINT_VALUES]


def weights_fingerprint(spec: str | None) -> str | None:
    """The weights fingerprint of a verifier spec without loading it: ``embedded`` or a
    local HF folder; None (unknown) for anything else, e.g. a hub id a server resolved."""
    if not spec:
        return None
    if spec == EMBEDDED:
        try:
            folder = embedded_folder()
        except SpecUIError:
            return None
        return folder_fingerprint(folder) if folder.is_dir() else None
    path = Path(spec).expanduser()
    return folder_fingerprint(path) if path.is_dir() else None
