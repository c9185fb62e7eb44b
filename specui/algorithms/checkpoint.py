"""Reading and writing speculators-format drafter checkpoints.

A checkpoint is a folder with ``config.json`` and ``model.safetensors``
(safetensors only: never pickle).  ``config.json`` carries
``speculators_model_type``, which picks the algorithm from the registry
(``specui.algorithms.spec``); its model class says which tensors it expects.

Verifier-owned weights follow the format: the DFlash family stores no
embedding / LM head (they are borrowed from the verifier at load time), EAGLE-3
stores frozen copies of both, P-EAGLE stores its own trainable embedding.  A
checkpoint that does not fit the verifier is refused with one SpecUIError that
names every mismatch found.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from specui.algorithms.base import DraftModel
from specui.algorithms.draft_config import DTYPES, DraftConfig
from specui.algorithms.spec import ALGORITHMS
from specui.errors import SpecUIError

if TYPE_CHECKING:
    from specui.algorithms.base import Drafter
    from specui.verifier.model import Verifier

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"

# --- loading -------------------------------------------------------------------------------


def read_checkpoint_config(folder: Path) -> dict[str, Any]:
    if folder.is_file():
        raise SpecUIError(
            f"a drafter checkpoint is a folder (config.json + {WEIGHTS_FILE}); {folder} is a file"
        )
    if not folder.is_dir():
        raise SpecUIError(f"drafter checkpoint folder not found: {folder}")
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise SpecUIError(f"drafter checkpoint {folder} has no {CONFIG_FILE}")
    try:
        d = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecUIError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise SpecUIError(f"{path} must hold a JSON object")
    return d


def checkpoint_model_class(d: dict[str, Any]) -> type[DraftModel]:
    model_type = d.get("speculators_model_type")
    if not isinstance(model_type, str):
        raise SpecUIError(
            "config.json has no 'speculators_model_type' (is this a speculators checkpoint?)"
        )
    return ALGORITHMS[model_type].model_class  # SpecUIError for an unknown type


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise SpecUIError(f"{path.parent} has no {WEIGHTS_FILE}")
    try:
        with safe_open(str(path), framework="pt") as f:
            # safe_open has no __iter__
            return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise SpecUIError(f"{path} is not a readable safetensors file ({e})") from None


def _inspect(
    folder: Path, verifier: Verifier
) -> tuple[list[str], DraftConfig | None, dict[str, torch.Tensor]]:
    """(problems, config, tensors) -- the shared core of validate and load."""
    try:
        d = read_checkpoint_config(folder)
        model_cls = checkpoint_model_class(d)
        config = model_cls.config_class.from_dict(d)
    except SpecUIError as e:
        return [str(e)], None, {}
    if not config.aux_layer_ids:
        config.aux_layer_ids = verifier.default_aux_layer_ids()
    problems = config.problems(verifier)
    if problems:  # shapes below would only repeat the mismatch
        return problems, config, {}
    try:
        tensors = _read_tensors(folder / WEIGHTS_FILE)
    except SpecUIError as e:
        return [str(e)], config, {}
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in model_cls(config).state_dict().items()}
    missing = sorted(
        k for k in expected if k not in tensors and k not in model_cls.verifier_fallback
    )
    if missing:
        problems.append(f"{WEIGHTS_FILE} lacks tensors {', '.join(missing)}")
    for k, shape in expected.items():
        t = tensors.get(k)
        if t is None:
            continue
        if tuple(t.shape) != shape:
            problems.append(f"tensor {k} has shape {list(t.shape)}, expected {list(shape)}")
        elif t.is_floating_point() and not torch.isfinite(t).all():
            problems.append(f"tensor {k} contains NaN or infinity")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        log.warning(
            "%s: ignoring tensors the %s drafter does not use: %s",
            folder,
            config.model_type,
            unexpected,
        )
    return problems, config, tensors


def validate_checkpoint(path: str | os.PathLike, verifier: Verifier) -> list[str]:
    """Problems that keep the checkpoint at ``path`` from running with ``verifier`` (empty:
    fine)."""
    return _inspect(Path(path), verifier)[0]


def load_model(path: str | os.PathLike, verifier: Verifier) -> DraftModel:
    """The drafter ``nn.Module`` stored at ``path``, float32, bound to ``verifier``."""
    folder = Path(path)
    problems, config, tensors = _inspect(folder, verifier)
    if problems:
        raise SpecUIError(f"cannot load drafter {folder}: {'; '.join(problems)}")
    assert config is not None
    model_cls = checkpoint_model_class(read_checkpoint_config(folder))
    model = model_cls(config)
    state = model.state_dict()  # views of the model's float32 parameters and buffers
    present = [k for k in state if k in tensors]
    with torch.no_grad():
        # Each stored tensor copied into its parameter (converted to float32 on the way) and let
        # go: a load holds the float32 model and what is left of the file, never a float32 copy
        # of the whole file beside them (_inspect checked every shape).
        for k in present:
            state[k].copy_(tensors.pop(k))
        # after d2t is in place: fallbacks may depend on the draft vocabulary
        for k in state.keys() - set(present):
            model.get_parameter(k).copy_(model.fallback_tensor(k, verifier))
    model.bind_verifier(verifier)
    return model.to(_device(verifier)).eval()


def load_drafter(
    path: str | os.PathLike,
    verifier: Verifier,
    num_speculative_tokens: int | None = None,
    **options: Any,
) -> Drafter:
    """Load a speculators-format folder as a ready-to-use Drafter for ``verifier``.

    ``num_speculative_tokens`` overrides the checkpoint's K (tokens per proposal);
    ``options`` go to the drafter class (DSpark: ``confidence_policy``).
    Raises SpecUIError naming every mismatch with the verifier.
    """
    model = load_model(path, verifier)
    drafter_cls = ALGORITHMS[model.config.model_type].drafter_class
    return drafter_cls(
        model, num_speculative_tokens=num_speculative_tokens, name=Path(path).name, **options
    )


def _device(verifier: Verifier) -> torch.device:
    return next(verifier.model.parameters()).device


# --- saving --------------------------------------------------------------------------------


def save_drafter(
    drafter_model: nn.Module | Drafter,
    path: str | os.PathLike,
    dtype: str | None = None,
    borrow: tuple[str, ...] = (),
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` into folder ``path`` (created if needed).

    Accepts a drafter model or a Drafter wrapping one (``.model``).  ``dtype``
    ("float32" | "bfloat16" | "float16") is the storage dtype, recorded in
    config.json; default: the model config's.  ``borrow``: frozen verifier copies
    (keys of ``verifier_fallback``) left out of the file, for the loader -- SpecUI's
    and vLLM's -- to take from the verifier (an EAGLE-3 / frozen P-EAGLE embedding is
    V*H parameters the checkpoint need not carry).  Each file is written to a
    temporary name and moved into place with ``os.replace``, so a failed save
    leaves any previous checkpoint in the folder intact.
    """
    model = getattr(drafter_model, "model", drafter_model)
    if not isinstance(model, DraftModel):
        raise SpecUIError(f"save_drafter needs a drafter model, got {type(model).__name__}")
    dtype = dtype or model.config.dtype
    if dtype not in DTYPES:
        raise SpecUIError(f"unsupported checkpoint dtype {dtype!r} ({', '.join(DTYPES)})")
    store = DTYPES[dtype]
    for key in borrow:
        if key not in model.verifier_fallback:
            raise SpecUIError(
                f"{key} is not a verifier tensor the {model.config.model_type} format may borrow"
            )
        if model.get_parameter(key).requires_grad:
            raise SpecUIError(f"{key} was trained (it is not the verifier's): it must be saved")
    tensors = {
        k: (v.detach().to("cpu", store) if v.is_floating_point() else v.detach().cpu())
        .contiguous()
        .clone()
        for k, v in model.state_dict().items()
        if k not in borrow
    }
    config = model.config.to_dict()
    config["dtype"] = dtype
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    tmp_weights = _temp_path(folder, WEIGHTS_FILE)
    tmp_config = _temp_path(folder, CONFIG_FILE)
    try:
        try:
            save_file(tensors, str(tmp_weights), metadata={"format": "pt"})
            os.chmod(tmp_weights, 0o644)  # safetensors writes its own file, owner-only
        except Exception as e:  # safetensors raises its own error type for I/O failures
            raise OSError(f"cannot write {folder / WEIGHTS_FILE}: {e}") from e
        try:
            with open(tmp_config, "w") as f:
                json.dump(config, f, indent=2)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:  # a full disk's ENOSPC names no file by itself
            raise OSError(e.errno, f"cannot write {folder / CONFIG_FILE}: {e.strerror or e}") from e
        os.replace(tmp_weights, folder / WEIGHTS_FILE)
        os.replace(tmp_config, folder / CONFIG_FILE)
    finally:
        for tmp in (tmp_weights, tmp_config):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return folder


def _temp_path(folder: Path, name: str) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    os.chmod(
        tmp, 0o644
    )  # mkstemp makes 0600; a saved drafter is for everyone who may read the folder
    return Path(tmp)
