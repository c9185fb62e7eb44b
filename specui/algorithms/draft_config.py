"""``DraftConfig``: the fields every speculators ``config.json`` has (an algorithm's
``config.py`` subclasses it), read with messages a user can act on (``read_field``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from specui.algorithms.layer_config import LayerConfig
from specui.errors import SpecUIError
from specui.trace import MAX_SPECULATIVE_TOKENS

if TYPE_CHECKING:
    from specui.verifier.model import Verifier

SPECULATORS_VERSION = "0.9.0"
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}  # storage dtypes

# --- reading config.json fields with messages a user can act on --------------------------

_REQUIRED = object()


def read_field(d: dict[str, Any], key: str, kind: str, default: Any = _REQUIRED) -> Any:
    """``d[key]`` checked against ``kind`` (int, bool, float, str, int-list, str-list; '?' = may be
    null)."""
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
        "int-list": isinstance(v, list)
        and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
        "str-list": isinstance(v, list) and all(isinstance(x, str) for x in v),
    }[kind]
    if not ok:
        raise SpecUIError(
            f"config.json field {key!r} must be {kind}{' or null' if optional else ''}, got {v!r}"
        )
    return float(v) if kind == "float" else v


# read_field's kind of each field type an algorithm's config declares (annotations are strings:
# ``from __future__ import annotations``); another type is a KeyError at its first read.
_FIELD_KINDS = {"int": "int", "int | None": "int?", "bool": "bool", "float": "float", "str": "str"}


# --- the config every drafter shares ------------------------------------------------------


@dataclass(kw_only=True)
class DraftConfig:
    """Fields every speculators checkpoint has; algorithms subclass and add theirs.

    Subclasses set the ClassVars and declare their per-algorithm fields, which
    ``own_from_dict`` / ``own_to_dict`` read and write by ``dataclasses.fields``.
    """

    model_type: ClassVar[str]  # speculators_model_type
    architecture: ClassVar[str]  # "DFlashDraftModel", ...
    config_class_name: ClassVar[str]  # for auto_map
    aux_key: ClassVar[str] = "aux_hidden_state_layer_ids"
    create_options: ClassVar[
        tuple[str, ...]
    ] = ()  # config fields a model's create(**options) accepts

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
            raise SpecUIError(
                "config.json speculators_config.proposal_methods must be a non-empty list"
            )
        k = read_field(methods[0], "speculative_tokens", "int")
        verifier = spec.get("verifier") if isinstance(spec.get("verifier"), dict) else {}
        dtype = (
            read_field(d, "dtype", "str?", "float32")
            or read_field(d, "torch_dtype", "str?", "float32")
            or "float32"
        )
        if dtype not in DTYPES:
            raise SpecUIError(f"config.json dtype {dtype!r} is not supported ({', '.join(DTYPES)})")
        return cls(
            layer=layer,
            aux_layer_ids=list(aux)
            if aux is not None
            else [],  # [] = the verifier's default, filled at load
            draft_vocab_size=read_field(d, "draft_vocab_size", "int?", None) or layer.vocab_size,
            num_speculative_tokens=k,
            verifier_name_or_path=read_field(verifier, "name_or_path", "str?", None),
            verifier_architectures=list(
                read_field(verifier, "architectures", "str-list?", None) or []
            ),
            dtype=dtype,
            **cls.own_from_dict(d),
        )

    @classmethod
    def own_fields(cls) -> list[dataclasses.Field]:
        """The fields a subclass adds (each a config.json key of its name), declared once."""
        shared = {f.name for f in dataclasses.fields(DraftConfig)}
        return [f for f in dataclasses.fields(cls) if f.name not in shared]

    @classmethod
    def own_from_dict(cls, d: dict[str, Any]) -> dict[str, Any]:
        """The subclass's fields from config.json, checked by their declared type, missing
        ones at their declared default."""
        return {
            f.name: read_field(d, f.name, _FIELD_KINDS[str(f.type)], f.default)
            for f in cls.own_fields()
        }

    def own_to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in self.own_fields()}

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
            out.append(
                f"hidden size {layer.hidden_size} does not match the verifier's"
                f" {verifier.hidden_size}"
            )
        if layer.vocab_size != verifier.vocab_size:
            out.append(
                f"vocab size {layer.vocab_size} does not match the verifier's {verifier.vocab_size}"
            )
        if not 0 < self.draft_vocab_size <= layer.vocab_size:
            out.append(f"draft_vocab_size {self.draft_vocab_size} must be in 1..{layer.vocab_size}")
        bad = [i for i in self.aux_layer_ids if not 0 <= i <= verifier.num_layers]
        if bad:
            out.append(
                f"aux hidden-state layer ids {bad} out of range for a verifier with "
                f"{verifier.num_layers} layers (0..{verifier.num_layers})"
            )
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            out.append(
                f"speculative_tokens must be in 1..{MAX_SPECULATIVE_TOKENS}, got"
                f" {self.num_speculative_tokens}"
            )
        return out

    def check_mask_token(self, mask_token_id: int | None) -> list[str]:
        if mask_token_id is None:
            return ["mask_token_id is not set"]
        if not 0 <= mask_token_id < self.layer.vocab_size:
            return [
                f"mask_token_id {mask_token_id} is outside the vocabulary"
                f" (0..{self.layer.vocab_size - 1})"
            ]
        return []
