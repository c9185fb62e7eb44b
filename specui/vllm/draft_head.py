"""A speculator that borrows the verifier's head and has a draft vocabulary, made servable by vLLM
0.32.

The DFlash family borrows the verifier's LM head, and a draft vocabulary smaller than the
verifier's is stored as ``d2t``.  vLLM 0.32's DFlash model then shares the verifier's whole
head but keeps its logits processor at the draft vocabulary's width, so draft slot j gets
the logit of verifier token j, not of token ``j + d2t[j]``: every draft is another token
and nothing is accepted (tau 1.00 where SpecUI's engine measures 1.9).  A checkpoint that
carries its own ``lm_head.weight`` (the verifier's rows of its draft tokens) is read the
way SpecUI reads it.  So the server is given a copy of the folder with those rows added,
made once per speculator and verifier under the data folder; the shipped folder itself
stays as it is (every byte of it is in every clone).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from specui.errors import SpecUIError
from specui.paths import data_dir

WEIGHTS = "model.safetensors"


def _verifier_head(verifier_dir: Path) -> torch.Tensor | None:
    """The verifier's LM head (its tied embedding when it has none), from its safetensors files."""
    files = sorted(verifier_dir.glob("*.safetensors"))
    for name in ("lm_head.weight", "model.embed_tokens.weight"):
        for file in files:
            with safe_open(str(file), "pt") as f:
                if name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                    return f.get_tensor(name)
    return None


def servable_folder(speculator: Path, verifier: str) -> Path:
    """``speculator``, or a copy of it that vLLM serves as SpecUI does (see the module doc)."""
    # Decided by the weights, not by the algorithm: any checkpoint with a draft vocabulary and no
    # head of its own meets the same sharing in vLLM (its own-head algorithms store one).
    verifier_dir = Path(verifier).expanduser()
    weights = speculator / WEIGHTS
    try:
        with safe_open(str(weights), "pt") as f:
            names = set(f.keys())  # noqa: SIM118
    except (OSError, SafetensorError):
        return speculator  # the launch (or vLLM) reports the unreadable file
    if "lm_head.weight" in names or "d2t" not in names or not verifier_dir.is_dir():
        return speculator  # its own head, the full vocabulary, or a hub id (no rows at hand)
    stat = weights.stat()
    key = hashlib.sha256(
        f"{weights.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{verifier_dir.resolve()}".encode()
    )
    out = data_dir() / "vllm-speculators" / f"{speculator.name}-{key.hexdigest()[:12]}"
    if (out / WEIGHTS).is_file() and (out / "config.json").is_file():
        return out
    head = _verifier_head(verifier_dir)
    if head is None:
        raise SpecUIError(
            f"{verifier_dir}: no lm_head.weight or embed_tokens in its safetensors files"
        )
    tensors = load_file(str(weights))
    d2t = tensors["d2t"].long()
    targets = torch.arange(d2t.numel()) + d2t
    dtype = tensors["fc.weight"].dtype if "fc.weight" in tensors else head.dtype
    tensors["lm_head.weight"] = head[targets].to(dtype).contiguous()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        shutil.copy2(speculator / "config.json", tmp / "config.json")
        os.replace(tmp, out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / WEIGHTS).is_file():
            raise
    return out
