"""The draft decoder's layer config (speculators' ``transformer_layer_config``): a
transformers Qwen3 / Llama config, read, checked, saved with the keys vLLM and speculators
read, and built like a verifier's (``LayerConfig.like_verifier``)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from specui.errors import SpecUIError

# The keys transformers 5.x writes for these two model types (to_diff_dict of a
# Qwen3Config / LlamaConfig, as in the speculators 0.9.0 fixtures).  Saving
# always writes all of them so the file has the same shape vLLM and speculators read.
_COMMON_KEYS = (
    "attention_bias",
    "attention_dropout",
    "bos_token_id",
    "eos_token_id",
    "head_dim",
    "hidden_act",
    "hidden_size",
    "initializer_range",
    "intermediate_size",
    "layer_types",
    "max_position_embeddings",
    "model_type",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "pad_token_id",
    "rms_norm_eps",
    "rope_parameters",
    "sliding_window",
    "tie_word_embeddings",
    "use_cache",
    "use_sliding_window",
    "vocab_size",
)
_QWEN3_KEYS = tuple(sorted([*_COMMON_KEYS, "max_window_layers"]))
_LLAMA_KEYS = tuple(sorted([*_COMMON_KEYS, "mlp_bias", "pretraining_tp"]))
# The sizes a layer config must give (positive integers; head_dim may be derived).
_SHAPE_SIZES = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
)
# The fields to_dict writes as the config holds them.
_SAVED_AS_IS = (
    "attention_bias",
    "head_dim",
    "hidden_size",
    "initializer_range",
    "intermediate_size",
    "max_position_embeddings",
    "model_type",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "rms_norm_eps",
    "sliding_window",
    "vocab_size",
)
_DEFAULTS: dict[str, Any] = {
    "attention_dropout": 0.0,
    "bos_token_id": None,
    "eos_token_id": None,
    "max_window_layers": 28,
    "pad_token_id": None,
    "pretraining_tp": 1,
    "tie_word_embeddings": False,
    "use_cache": True,
    "use_sliding_window": False,
}


@dataclass(kw_only=True)
class LayerConfig:
    """The draft decoder's ``transformer_layer_config`` (a transformers Qwen3/Llama config)."""

    model_type: str  # "qwen3" (q_norm/k_norm) or "llama"
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    layer_types: list[str] = field(default_factory=list)  # "full_attention" | "sliding_attention"
    sliding_window: int | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    initializer_range: float = 0.02
    extra: dict[str, Any] = field(default_factory=dict)  # other keys, written back verbatim

    def __post_init__(self) -> None:
        if not self.layer_types:
            self.layer_types = ["full_attention"] * self.num_hidden_layers

    @property
    def qk_norm(self) -> bool:
        return self.model_type != "llama"

    def window(self, layer_idx: int) -> int | None:
        """The sliding window of a layer, or None for full attention."""
        return self.sliding_window if self.layer_types[layer_idx] == "sliding_attention" else None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerConfig:
        where = "transformer_layer_config"
        if not isinstance(d, dict):
            raise SpecUIError(f"config.json field {where!r} must be an object")
        known = {f.name for f in fields(cls)} - {"extra", "rope_theta"}
        kw: dict[str, Any] = {}
        for name in ("model_type", *_SHAPE_SIZES, "vocab_size"):
            if name not in d:
                raise SpecUIError(f"config.json {where} has no {name!r}")
        if d["model_type"] not in ("qwen3", "llama"):
            raise SpecUIError(
                f"{where}.model_type {d['model_type']!r} is not supported (qwen3 or llama)"
            )
        kw["head_dim"] = d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]
        for name in known - {"head_dim"}:
            if name in d and d[name] is not None:
                kw[name] = d[name]
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise SpecUIError(f"{where}.rope_parameters must be an object")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise SpecUIError(f"{where}: rope_type {rope_type!r} is not supported (only 'default')")
        kw["rope_theta"] = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
        if d.get("hidden_act", "silu") != "silu":
            raise SpecUIError(
                f"{where}: hidden_act {d['hidden_act']!r} is not supported (only 'silu')"
            )
        for name in (*_SHAPE_SIZES, "head_dim", "vocab_size"):
            if not isinstance(kw[name], int) or isinstance(kw[name], bool) or kw[name] <= 0:
                raise SpecUIError(f"{where}.{name} must be a positive integer, got {kw[name]!r}")
        if kw["num_attention_heads"] % kw["num_key_value_heads"]:
            raise SpecUIError(
                f"{where}: num_attention_heads must be a multiple of num_key_value_heads"
            )
        types = kw.get("layer_types") or []
        if types and (
            len(types) != kw["num_hidden_layers"]
            or set(types) - {"full_attention", "sliding_attention"}
        ):
            raise SpecUIError(
                f"{where}.layer_types must list 'full_attention'/'sliding_attention' once per"
                f" layer, got {types}"
            )
        if "sliding_attention" in types and not kw.get("sliding_window"):
            raise SpecUIError(f"{where}: sliding_attention layers need a sliding_window")
        kw["rms_norm_eps"] = float(kw.get("rms_norm_eps", 1e-6))
        extra = {
            k: v
            for k, v in d.items()
            if k not in known and k not in ("rope_parameters", "rope_theta", "hidden_act")
        }
        return cls(**kw, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        keys = _LLAMA_KEYS if self.model_type == "llama" else _QWEN3_KEYS
        out: dict[str, Any] = {k: _DEFAULTS.get(k) for k in keys}
        out.update({k: v for k, v in self.extra.items() if not k.startswith("_")})
        out.update({k: getattr(self, k) for k in _SAVED_AS_IS})
        out.update(
            hidden_act="silu",
            layer_types=list(self.layer_types),
            rope_parameters={"rope_theta": self.rope_theta, "rope_type": "default"},
        )
        if self.model_type == "llama":
            out["mlp_bias"] = self.mlp_bias
        return dict(sorted(out.items()))

    @classmethod
    def like_verifier(
        cls, verifier_config: Any, model_type: str, num_layers: int, **overrides: Any
    ) -> LayerConfig:
        """A draft layer config with the verifier's widths (hidden, heads, MLP, vocab)."""
        c = verifier_config
        heads = c.num_attention_heads
        rope = getattr(c, "rope_parameters", None) or {}
        theta = (
            rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
            if isinstance(rope, dict)
            else 10000.0
        )
        eos = getattr(c, "eos_token_id", None)
        kw: dict[str, Any] = dict(
            model_type=model_type,
            hidden_size=c.hidden_size,
            intermediate_size=c.intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            num_key_value_heads=getattr(c, "num_key_value_heads", None) or heads,
            head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
            vocab_size=c.vocab_size,
            rms_norm_eps=float(getattr(c, "rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=int(getattr(c, "max_position_embeddings", 2048) or 2048),
            initializer_range=float(getattr(c, "initializer_range", 0.02) or 0.02),
            extra={
                "bos_token_id": getattr(c, "bos_token_id", None),
                "eos_token_id": eos if isinstance(eos, int | None) else list(eos),
            },
        )
        kw.update(overrides)
        return cls(**kw)
