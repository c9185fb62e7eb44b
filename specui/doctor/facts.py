"""Reading a speculator folder once for the static checks, and telling a truncated or
damaged weights file from a good one by its safetensors header."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open

from specui.algorithms.spec import ALGORITHMS
from specui.doctor.findings import Finding, Severity
from specui.errors import SpecUIError

if TYPE_CHECKING:
    pass

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
READ_MAP = ("d2t", "t2d")  # the small tensors the checks read whole


@dataclass
class Facts:
    """What the checks read from a speculator folder, once."""

    folder: Path
    config: dict[str, Any] | None = None
    tensor_names: set[str] = field(default_factory=set)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # only READ_MAP ones
    weights_ok: bool = False
    draft_config: Any = None  # the algorithm's DraftConfig, where it parses

    @property
    def model_type(self) -> str | None:
        t = (self.config or {}).get("speculators_model_type")
        return t if isinstance(t, str) else None


def read_facts(folder: Path) -> tuple[Facts, list[Finding]]:
    """The folder's config and tensor names, and findings for files that cannot be read."""
    facts = Facts(folder=folder)
    findings: list[Finding] = []
    cfg_path = folder / CONFIG_FILE
    try:
        d = json.loads(cfg_path.read_text())
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        facts.config = d
    except (OSError, ValueError, UnicodeDecodeError) as e:
        findings.append(
            Finding(
                "config_unreadable",
                Severity.ERROR,
                f"{CONFIG_FILE} cannot be read",
                evidence=f"{cfg_path}: {e}",
                cause="the folder is not a speculators checkpoint, or the file is damaged",
                fix="copy config.json again from where the checkpoint was made",
            )
        )
    problem = weights_integrity(folder / WEIGHTS_FILE)
    if problem is not None:
        findings.append(
            Finding(
                "weights_unreadable",
                Severity.ERROR,
                f"{WEIGHTS_FILE} is truncated or damaged",
                evidence=problem,
                cause=(
                    "an interrupted download, copy or save (the file ends before the tensors its"
                    " header lists)"
                ),
                fix=(
                    "download or copy model.safetensors again and compare its size and sha256 with"
                    " the source"
                ),
            )
        )
        return facts, findings
    with safe_open(str(folder / WEIGHTS_FILE), framework="pt") as f:
        facts.tensor_names = set(f.keys())  # noqa: SIM118 - safe_open has no __iter__
        facts.tensors = {k: f.get_tensor(k) for k in READ_MAP if k in facts.tensor_names}
    facts.weights_ok = True
    spec = ALGORITHMS.get(facts.model_type or "")
    if spec is not None and facts.config is not None:
        try:
            facts.draft_config = spec.config_class.from_dict(facts.config)
        except SpecUIError as e:
            findings.append(
                Finding(
                    "config_unreadable",
                    Severity.ERROR,
                    f"{CONFIG_FILE} does not parse as a {spec.label} config",
                    evidence=str(e),
                    cause="a field is missing or has the wrong type",
                    fix="fix or regenerate config.json",
                )
            )
    return facts, findings


def weights_integrity(path: Path) -> str | None:
    """Why ``path`` is not a complete safetensors file, or None.  Reads the header only:
    a truncated file still has it, and its offsets say how long the file must be."""
    if not path.is_file():
        return f"{path} does not exist"
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path.name} has {size} bytes: not even a safetensors header length"
            n = int.from_bytes(head, "little")
            if 8 + n > size:
                return f"{path.name} has {size:,} bytes but its header alone claims {8 + n:,}"
            header = json.loads(f.read(n))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return f"{path.name}: unreadable safetensors header ({e})"
    ends = [
        v["data_offsets"][1]
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict)
    ]
    need = 8 + n + max(ends, default=0)
    if size < need:
        return (
            f"{path.name} has {size:,} bytes; its header lists tensors up to byte {need:,}"
            f" ({size / need:.0%} present)"
        )
    try:
        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():  # noqa: SIM118
                f.get_slice(k)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        return f"{path.name}: {e}"
    return None
