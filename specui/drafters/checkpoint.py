"""Reading and writing speculators-format drafter checkpoints.

A checkpoint is a folder with ``config.json`` and ``model.safetensors``
(safetensors only: never pickle).  ``config.json`` carries
``speculators_model_type``, which picks the drafter class from the registry in
``specui.drafters.base``; that class's model says which tensors it expects.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from specui.drafters.base import lookup
from specui.drafters.layers import LayerConfig
from specui.trace import MAX_SPECULATIVE_TOKENS, SpecUIError

if TYPE_CHECKING:
    from specui.drafters.base import Drafter
    from specui.verifier import Verifier

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SPECULATORS_VERSION = "0.9.0"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# --- reading config.json fields with messages a user can act on --------------------------

_REQUIRED = object()


def read_field(d: dict[str, Any], key: str, kind: str, default: Any = _REQUIRED) -> Any:
    """``d[key]`` checked against ``kind`` (int, bool, float, str, int-list, str-list; '?' = may be null)."""
    optional = kind.endswith("?")
    kind = kind.rstrip("?")
    if key not in d:
        if default is _REQUIRED:
            raise SpecUIError(f"config.json has no {key!r}")
        return default
    v = d[key]
    if v is None and optional:
        return None
    ok = {
        "int": isinstance(v, int) and not isinstance(v, bool),
        "bool": isinstance(v, bool),
        "float": isinstance(v, int | float) and not isinstance(v, bool),
        "str": isinstance(v, str),
        "int-list": isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
        "str-list": isinstance(v, list) and all(isinstance(x, str) for x in v),
    }[kind]
    if not ok:
        raise SpecUIError(f"config.json field {key!r} must be {kind}{' or null' if optional else ''}, got {v!r}")
    return float(v) if kind == "float" else v


# --- the config every drafter shares ------------------------------------------------------


@dataclass(kw_only=True)
class DraftConfig:
    """Fields every speculators checkpoint has; algorithms subclass and add theirs.

    Subclasses set the ClassVars and implement ``own_from_dict`` / ``own_to_dict``
    for their per-algorithm fields.
    """

    model_type: ClassVar[str]  # speculators_model_type
    architecture: ClassVar[str]  # "DFlashDraftModel", ...
    config_class_name: ClassVar[str]  # for auto_map
    aux_key: ClassVar[str] = "aux_hidden_state_layer_ids"
    create_options: ClassVar[tuple[str, ...]] = ()  # config fields a model's create(**options) accepts

    layer: LayerConfig
    aux_layer_ids: list[int]
    draft_vocab_size: int
    num_speculative_tokens: int  # speculators_config.proposal_methods[0].speculative_tokens
    verifier_name_or_path: str | None = None
    verifier_architectures: list[str] = field(default_factory=list)
    dtype: str = "float32"  # storage dtype of model.safetensors

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DraftConfig:
        if "transformer_layer_config" not in d:
            raise SpecUIError("config.json has no 'transformer_layer_config'")
        layer = LayerConfig.from_dict(d["transformer_layer_config"])
        aux = read_field(d, cls.aux_key, "int-list?", None)
        spec = d.get("speculators_config")
        if not isinstance(spec, dict):
            raise SpecUIError("config.json has no 'speculators_config' object")
        methods = spec.get("proposal_methods")
        if not isinstance(methods, list) or not methods or not isinstance(methods[0], dict):
            raise SpecUIError("config.json speculators_config.proposal_methods must be a non-empty list")
        k = read_field(methods[0], "speculative_tokens", "int")
        verifier = spec.get("verifier") if isinstance(spec.get("verifier"), dict) else {}
        dtype = read_field(d, "dtype", "str?", "float32") or read_field(d, "torch_dtype", "str?", "float32") or "float32"
        if dtype not in _DTYPES:
            raise SpecUIError(f"config.json dtype {dtype!r} is not supported ({', '.join(_DTYPES)})")
        return cls(
            layer=layer,
            aux_layer_ids=list(aux) if aux is not None else [],  # [] = the verifier's default, filled at load
            draft_vocab_size=read_field(d, "draft_vocab_size", "int?", None) or layer.vocab_size,
            num_speculative_tokens=k,
            verifier_name_or_path=read_field(verifier, "name_or_path", "str?", None),
            verifier_architectures=list(read_field(verifier, "architectures", "str-list?", None) or []),
            dtype=dtype,
            **cls.own_from_dict(d),
        )

    @classmethod
    def own_from_dict(cls, d: dict[str, Any]) -> dict[str, Any]:
        return {}

    def own_to_dict(self) -> dict[str, Any]:
        return {}

    def to_dict(self) -> dict[str, Any]:
        import transformers

        d: dict[str, Any] = {
            "architectures": [self.architecture],
            "auto_map": {"": f"config.{self.config_class_name}"},
            self.aux_key: list(self.aux_layer_ids),
            "draft_vocab_size": self.draft_vocab_size,
            "dtype": self.dtype,
            "speculators_config": {
                "algorithm": self.model_type,
                "default_proposal_method": "greedy",
                "proposal_methods": [
                    {
                        "accept_tolerance": 0.0,
                        "proposal_type": "greedy",
                        "speculative_tokens": self.num_speculative_tokens,
                        "verifier_accept_k": 1,
                    }
                ],
                "verifier": {
                    "architectures": list(self.verifier_architectures),
                    "name_or_path": self.verifier_name_or_path,
                },
            },
            "speculators_model_type": self.model_type,
            "speculators_version": SPECULATORS_VERSION,
            "target_hidden_size": None,
            "tie_word_embeddings": False,
            "transformer_layer_config": self.layer.to_dict(),
            "transformers_version": transformers.__version__,
        }
        d.update(self.own_to_dict())
        return dict(sorted(d.items()))

    def problems(self, verifier: Verifier) -> list[str]:
        """Every way this config does not fit ``verifier`` (empty when it fits)."""
        out: list[str] = []
        layer = self.layer
        if layer.hidden_size != verifier.hidden_size:
            out.append(f"hidden size {layer.hidden_size} does not match the verifier's {verifier.hidden_size}")
        if layer.vocab_size != verifier.vocab_size:
            out.append(f"vocab size {layer.vocab_size} does not match the verifier's {verifier.vocab_size}")
        if not 0 < self.draft_vocab_size <= layer.vocab_size:
            out.append(f"draft_vocab_size {self.draft_vocab_size} must be in 1..{layer.vocab_size}")
        bad = [i for i in self.aux_layer_ids if not 0 <= i <= verifier.num_layers]
        if bad:
            out.append(
                f"aux hidden-state layer ids {bad} out of range for a verifier with "
                f"{verifier.num_layers} layers (0..{verifier.num_layers})"
            )
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            out.append(f"speculative_tokens must be in 1..{MAX_SPECULATIVE_TOKENS}, got {self.num_speculative_tokens}")
        return out

    def check_mask_token(self, mask_token_id: int | None) -> list[str]:
        if mask_token_id is None:
            return ["mask_token_id is not set"]
        if not 0 <= mask_token_id < self.layer.vocab_size:
            return [f"mask_token_id {mask_token_id} is outside the vocabulary (0..{self.layer.vocab_size - 1})"]
        return []


# --- what a drafter model class provides (see dflash.py for the pattern) -----------------


class DraftModel(nn.Module):
    """Base of the four drafter ``nn.Module``s: a config plus the checkpoint hooks.

    ``state_dict()`` holds exactly the tensors the checkpoint stores (borrowed
    verifier modules are kept out of the module tree).  Keys in
    ``verifier_fallback`` may be absent from a checkpoint and are then copied
    from the verifier (the library does the same).
    """

    config_class: ClassVar[type[DraftConfig]]
    verifier_fallback: ClassVar[tuple[str, ...]] = ()
    config: DraftConfig

    def bind_verifier(self, verifier: Verifier) -> None:
        """Borrow the frozen verifier parts this model uses but does not store."""

    def fallback_tensor(self, key: str, verifier: Verifier) -> torch.Tensor:
        """The verifier's tensor standing in for a missing ``key``."""
        raise KeyError(key)


def draft_vocab_rows(weight: torch.Tensor, d2t: torch.Tensor | None) -> torch.Tensor:
    """Rows of a [V, H] verifier matrix for the draft vocabulary (all rows when full)."""
    if d2t is None:
        return weight
    return weight[torch.arange(d2t.numel(), device=d2t.device) + d2t.to(weight.device)]


# --- loading -------------------------------------------------------------------------------


def _read_config(folder: Path) -> dict[str, Any]:
    if folder.is_file():
        raise SpecUIError(f"a drafter checkpoint is a folder (config.json + {WEIGHTS_FILE}); {folder} is a file")
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


def _model_class(d: dict[str, Any]) -> type[DraftModel]:
    model_type = d.get("speculators_model_type")
    if not isinstance(model_type, str):
        raise SpecUIError("config.json has no 'speculators_model_type' (is this a speculators checkpoint?)")
    return lookup(model_type).model_class  # SpecUIError for an unknown type


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise SpecUIError(f"{path.parent} has no {WEIGHTS_FILE}")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise SpecUIError(f"{path} is not a readable safetensors file ({e})") from None


def _inspect(folder: Path, verifier: Verifier) -> tuple[list[str], DraftConfig | None, dict[str, torch.Tensor]]:
    """(problems, config, tensors) -- the shared core of validate and load."""
    try:
        d = _read_config(folder)
        model_cls = _model_class(d)
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
    missing = sorted(k for k in expected if k not in tensors and k not in model_cls.verifier_fallback)
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
        log.warning("%s: ignoring tensors the %s drafter does not use: %s", folder, config.model_type, unexpected)
    return problems, config, tensors


def validate_checkpoint(path: str | os.PathLike, verifier: Verifier) -> list[str]:
    """Problems that keep the checkpoint at ``path`` from running with ``verifier`` (empty: fine)."""
    return _inspect(Path(path), verifier)[0]


def load_model(path: str | os.PathLike, verifier: Verifier) -> DraftModel:
    """The drafter ``nn.Module`` stored at ``path``, float32, bound to ``verifier``."""
    folder = Path(path)
    problems, config, tensors = _inspect(folder, verifier)
    if problems:
        raise SpecUIError(f"cannot load drafter {folder}: {'; '.join(problems)}")
    assert config is not None
    model_cls = _model_class(_read_config(folder))
    model = model_cls(config)
    state = model.state_dict()
    present = {k: tensors[k].to(ref.dtype) for k, ref in state.items() if k in tensors}
    model.load_state_dict(present, strict=False)  # computes in float32 whatever the storage dtype
    with torch.no_grad():  # after d2t is in place: fallbacks may depend on the draft vocabulary
        for k in state.keys() - present.keys():
            model.get_parameter(k).copy_(model.fallback_tensor(k, verifier))
    model.bind_verifier(verifier)
    return model.to(_device(verifier)).eval()


def load_drafter(
    path: str | os.PathLike, verifier: Verifier, num_speculative_tokens: int | None = None, **options: Any
) -> Drafter:
    """Load a speculators-format folder as a ready-to-use Drafter for ``verifier``.

    ``num_speculative_tokens`` overrides the checkpoint's K (tokens per proposal);
    ``options`` go to the drafter class (DSpark: ``confidence_policy``).
    Raises SpecUIError naming every mismatch with the verifier.
    """
    model = load_model(path, verifier)
    drafter_cls = lookup(model.config.model_type)
    return drafter_cls(model, num_speculative_tokens=num_speculative_tokens, name=Path(path).name, **options)


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
    if dtype not in _DTYPES:
        raise SpecUIError(f"unsupported checkpoint dtype {dtype!r} ({', '.join(_DTYPES)})")
    store = _DTYPES[dtype]
    for key in borrow:
        if key not in model.verifier_fallback:
            raise SpecUIError(f"{key} is not a verifier tensor the {model.config.model_type} format may borrow")
        if model.get_parameter(key).requires_grad:
            raise SpecUIError(f"{key} was trained (it is not the verifier's): it must be saved")
    tensors = {
        k: (v.detach().to("cpu", store) if v.is_floating_point() else v.detach().cpu()).contiguous().clone()
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
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; a saved drafter is for everyone who may read the folder
    return Path(tmp)
