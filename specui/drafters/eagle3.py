"""EAGLE-3: the autoregressive baseline (arXiv 2503.01840).

One (or a few) Llama/Qwen3 layers read ``[embed(token); fc(verifier taps)]``
through the wide first layer and draft one token per forward pass, feeding
their own output hidden state back in as the next step's feature: K
speculative tokens cost K passes.

Index convention (the speculators "shifted" layout): row i stands for the
verifier having processed position i and emitted x[i+1].  Row i's input is
(token x[i+1], verifier feature of position i), its RoPE position i+1, and its
logits predict x[i+2].

Training layout: ``Eagle3Model.forward_ttt`` -- training-time test (TTT)
steps over a whole sequence; step s (s >= 1) re-runs every row on its own
step-(s-1) output with the teacher token x[i+1+s] at position i+1+s, seeing
the step-0 rows j <= i and its own earlier steps (a diagonal), nothing else.
Inference: ``Eagle3Drafter.propose`` -- step-0 rows of committed positions
are cached per layer and extended incrementally; the speculative steps'
entries are dropped after each block.

P-EAGLE (peagle.py) reuses this model's layers and adds ``mask_hidden``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from specui.drafters.base import DraftContext, register
from specui.drafters.checkpoint import DraftConfig, DraftModel, draft_vocab_rows, read_field
from specui.drafters.layers import (
    KV,
    DecoderLayer,
    Eagle3FirstLayer,
    LayerConfig,
    LearnedDrafter,
    PrefixCache,
    RMSNorm,
    Rotary,
    extend_kv,
    init_weights,
    pick_tokens,
    project_features,
    register_vocab_map,
    seeded,
    set_draft_vocab,
    to_target_vocab,
    verifier_identity,
)
from specui.trace import Proposal, SpecUIError


@dataclass(kw_only=True)
class Eagle3Config(DraftConfig):
    model_type: ClassVar[str] = "eagle3"
    architecture: ClassVar[str] = "Eagle3DraftModel"
    config_class_name: ClassVar[str] = "Eagle3SpeculatorConfig"
    aux_key: ClassVar[str] = "eagle_aux_hidden_state_layer_ids"
    create_options: ClassVar[tuple[str, ...]] = (
        "norm_before_fc", "fc_norm", "norm_before_residual", "norm_output", "embed_requires_grad",
    )  # fmt: skip

    norm_before_fc: bool = False  # one RMSNorm (input_norm) over the concatenated taps before fc
    fc_norm: bool = False  # one RMSNorm per tap instead
    norm_before_residual: bool = False  # residual stream starts from hidden_norm(fc(.)), not fc(.)
    norm_output: bool = False  # feed the *normed* output to the next step
    embed_requires_grad: bool = False

    @classmethod
    def own_from_dict(cls, d: dict[str, Any]) -> dict[str, Any]:
        return {
            name: read_field(d, name, "bool", getattr(cls, name))
            for name in ("norm_before_fc", "fc_norm", "norm_before_residual", "norm_output", "embed_requires_grad")
        }

    def own_to_dict(self) -> dict[str, Any]:
        return {
            "embed_requires_grad": self.embed_requires_grad,
            "fc_norm": self.fc_norm,
            "norm_before_fc": self.norm_before_fc,
            "norm_before_residual": self.norm_before_residual,
            "norm_output": self.norm_output,
        }

    def problems(self, verifier: Any) -> list[str]:
        out = super().problems(verifier)
        if self.norm_before_fc and self.fc_norm:
            out.append("norm_before_fc and fc_norm cannot both be set")
        return out


@dataclass
class TTTOutput:
    """Training-layout result of S TTT steps over T' rows."""

    logits: torch.Tensor  # [S, T', Vd]; logits[s, i] predicts x[i+s+2] (target: verifier logits at i+s+1)
    hidden: torch.Tensor  # [S, T', H] last-layer output of each step (normed when norm_output)


class Eagle3Model(DraftModel):
    config_class: ClassVar[type[DraftConfig]] = Eagle3Config
    config: Eagle3Config
    # Frozen copies of the verifier's; a checkpoint without them gets the verifier's.
    verifier_fallback: ClassVar[tuple[str, ...]] = ("embed_tokens.weight", "lm_head.weight")

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        self.config = config
        cfg = config.layer
        H, n_aux = cfg.hidden_size, len(config.aux_layer_ids)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H)
        self.embed_tokens.weight.requires_grad_(config.embed_requires_grad)
        self.fc = nn.Linear(n_aux * H, H, bias=False)
        self.input_norm = RMSNorm(n_aux * H, cfg.rms_norm_eps) if config.norm_before_fc else None
        self.fc_norm = nn.ModuleList(RMSNorm(H, cfg.rms_norm_eps) for _ in range(n_aux)) if config.fc_norm else None
        self.layers = nn.ModuleList(
            [Eagle3FirstLayer(cfg, cfg.qk_norm, config.norm_before_residual)]
            + [DecoderLayer(cfg, cfg.qk_norm) for _ in range(cfg.num_hidden_layers - 1)]
        )
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, config.draft_vocab_size, bias=False)
        self.lm_head.weight.requires_grad_(False)  # the verifier's head (draft-vocabulary rows)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta)
        register_vocab_map(self, cfg.vocab_size, config.draft_vocab_size)

    # --- construction ------------------------------------------------------------------

    default_layers: ClassVar[int] = 1
    default_k: ClassVar[int] = 3
    default_model_type: ClassVar[str] = "llama"
    default_options: ClassVar[dict[str, bool]] = {  # the speculators trainer's eagle3 defaults
        "norm_before_fc": True, "norm_output": True, "norm_before_residual": True,
    }  # fmt: skip

    @classmethod
    def create(
        cls,
        verifier: Any,
        *,
        num_layers: int | None = None,
        num_speculative_tokens: int | None = None,
        aux_layer_ids: list[int] | None = None,
        model_type: str | None = None,
        layer_types: list[str] | None = None,
        sliding_window: int | None = None,
        intermediate_size: int | None = None,
        draft_vocab: list[int] | torch.Tensor | None = None,
        seed: int | None = None,
        **options: Any,
    ) -> Eagle3Model:
        """A freshly initialised drafter with the verifier's widths, ready to train.

        Embedding and LM head start as copies of the verifier's.  ``options``:
        the config fields in ``config_class.create_options`` (and
        ``mask_token_id`` for P-EAGLE).
        """
        unknown = set(options) - set(cls.config_class.create_options)
        if unknown:
            raise SpecUIError(f"unknown {cls.config_class.model_type} option(s): {', '.join(sorted(unknown))}")
        aux = list(aux_layer_ids) if aux_layer_ids is not None else verifier.default_aux_layer_ids()
        verifier.check_aux_layer_ids(aux)
        n = num_layers or cls.default_layers
        layer = LayerConfig.like_verifier(
            verifier.config, model_type or cls.default_model_type, n,
            layer_types=layer_types or ["full_attention"] * n, sliding_window=sliding_window,
            **({"intermediate_size": intermediate_size} if intermediate_size else {}),
        )  # fmt: skip
        config = cls.config_class(
            layer=layer,
            aux_layer_ids=aux,
            draft_vocab_size=len(draft_vocab) if draft_vocab is not None else verifier.vocab_size,
            num_speculative_tokens=num_speculative_tokens or cls.default_k,
            **verifier_identity(verifier),
            **(cls.default_options | cls.create_defaults(verifier) | options),
        )
        problems = config.problems(verifier)
        if problems:
            raise SpecUIError("; ".join(problems))
        with seeded(seed):
            model = cls(config)
            init_weights(model, layer.initializer_range)
            model.init_extra()
        if draft_vocab is not None:
            set_draft_vocab(model, draft_vocab)
        with torch.no_grad():
            for key in cls.verifier_fallback:
                model.get_parameter(key).copy_(model.fallback_tensor(key, verifier))
        return model.to(next(verifier.model.parameters()).device)

    @classmethod
    def create_defaults(cls, verifier: Any) -> dict[str, Any]:
        return {}

    def init_extra(self) -> None:
        """Subclass hook: initialisation beyond init_weights."""

    def fallback_tensor(self, key: str, verifier: Any) -> torch.Tensor:
        if key == "embed_tokens.weight":
            return verifier.embed_tokens.weight.detach().float()
        if key == "lm_head.weight":
            return draft_vocab_rows(verifier.lm_head.weight.detach().float(), self.d2t)
        raise KeyError(key)

    # --- the pieces ----------------------------------------------------------------------

    def features(self, taps: torch.Tensor) -> torch.Tensor:
        """Verifier taps [..., n_aux*H] -> g [..., H]."""
        return project_features(taps, self.fc, self.input_norm, self.fc_norm)

    def run_layers(
        self,
        embeds: torch.Tensor,
        g: torch.Tensor,
        positions: torch.Tensor,
        visible: list[torch.Tensor],
        past: list[KV] | None = None,
    ) -> tuple[torch.Tensor, list[KV]]:
        """Rows [1, 1, S, H] of token embeddings and features at ``positions`` [1, 1, S].

        ``visible`` per layer [.., S, P+S] over ``past`` (per layer (k, v)
        [1, 1, Hkv, P, D]) then the rows themselves.  Returns (last-layer
        output [1, 1, S, H], each layer's new (k, v)).
        """
        cos, sin = self.rotary(positions)
        h = torch.cat([embeds, g], dim=-1)  # [1, 1, S, 2H]: the first layer splits it again
        new_kv = []
        for i, layer in enumerate(self.layers):
            h, kv = layer(h, cos, sin, visible[i], past[i] if past is not None else None)
            new_kv.append(kv)
        return h, new_kv

    def output(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Last-layer output -> (draft logits [.., Vd], the feature the next step reads)."""
        normed = self.norm(h)
        return self.lm_head(normed), normed if self.config.norm_output else h

    # --- training layout -------------------------------------------------------------------

    def forward_ttt(
        self,
        features: torch.Tensor,
        input_ids: torch.Tensor,
        ttt_steps: int | None = None,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        step_input_ids: torch.Tensor | None = None,
    ) -> TTTOutput:
        """TTT steps over one (packed) sequence in the shifted layout, differentiably.

        features       [T', n_aux*H] (or [1, T', .]): row i = taps of original position i.
        input_ids      [T']: row i = x[i+1] (T' = T-1).
        ttt_steps      S (default: the checkpoint's K).
        position_ids   [T'] RoPE position of step 0 (default i+1); step s adds s.
        document_ids   [T'] (default 0; -1 = padding).
        step_input_ids [S, T'] tokens of each step (default teacher forcing:
                       input_ids shifted left by s, padded with 0 -- as the library does).

        Step s row i sees step-0 rows j <= i of its document (j > i - window on
        sliding layers) and rows (s', i), 1 <= s' <= s.  Rows i >= T'-s of step
        s are padding (their teacher token is 0); leave them out of the loss.
        """
        T = input_ids.numel()
        ids = input_ids.reshape(T)
        taps = features.reshape(T, -1)
        dev = taps.device
        S = ttt_steps or self.config.num_speculative_tokens
        pos0 = position_ids.reshape(T) if position_ids is not None else torch.arange(1, T + 1, device=dev)
        doc = document_ids.reshape(T) if document_ids is not None else torch.zeros(T, dtype=torch.long, device=dev)

        i = torch.arange(T, device=dev)
        base = (i[None] <= i[:, None]) & (doc[None] == doc[:, None]) & (doc[:, None] >= 0)  # [T', T'] step-0 keys
        diag = torch.eye(T, dtype=torch.bool, device=dev)
        step0_vis = []
        for li in range(len(self.layers)):
            w = self.config.layer.window(li)
            vis = base & (i[None] > i[:, None] - w) if w is not None else base
            step0_vis.append(vis | diag)  # a row always sees itself (padding rows too)

        g = self.features(taps)[None, None]  # [1, 1, T', H]
        past: list[KV] | None = None
        logits, hiddens = [], []
        for s in range(S):
            if step_input_ids is not None:
                tok = step_input_ids[s].reshape(T)
            else:
                tok = torch.cat([ids[s:], ids.new_zeros(s)])
            # keys: step-0 rows (causal), then one diagonal block per earlier step and this one
            visible = [torch.cat([v] + [diag] * s, dim=-1)[None, None] for v in step0_vis]
            h, kv = self.run_layers(self.embed_tokens(tok)[None, None], g, (pos0 + s)[None, None], visible, past)
            past = extend_kv(past, kv)
            step_logits, g = self.output(h)
            logits.append(step_logits[0, 0])
            hiddens.append(g[0, 0])
        return TTTOutput(logits=torch.stack(logits), hidden=torch.stack(hiddens))


# --- inference ---------------------------------------------------------------------------------


class EagleRowCache:
    """Per-layer K/V of the step-0 rows (0..P-1) of committed positions, grown incrementally."""

    def __init__(self) -> None:
        self.prefix = PrefixCache()
        self.kv: list[KV] | None = None  # per layer (k, v) [1, 1, Hkv, P, D]
        self.rows = 0

    def valid_rows(self, ids: torch.Tensor, max_rows: int) -> int:
        """Rows still valid for committed ``ids`` (row i used tokens up to x[i+1]), at most ``max_rows``."""
        if self.prefix.valid_length(ids, self.rows + 1) == 0:
            self.kv, self.rows = None, 0
        if self.rows > max_rows and self.kv is not None:  # asked again for the same anchor: redo its row
            self.kv = [(k[..., :max_rows, :], v[..., :max_rows, :]) for k, v in self.kv]
            self.rows = max_rows
        return self.rows

    def append(self, ids: torch.Tensor, kv: list[KV], n: int) -> None:
        """Keep the first ``n`` new rows of ``kv`` (per layer [1, 1, Hkv, S, D])."""
        self.kv = extend_kv(self.kv, [(k[..., :n, :], v[..., :n, :]) for k, v in kv])
        self.rows += n
        self.prefix.remember(ids)

    def empty(self, model: nn.Module, device: torch.device) -> list[KV]:
        cfg = model.config.layer
        z = torch.zeros(1, 1, cfg.num_key_value_heads, 0, cfg.head_dim, device=device)
        return [(z, z)] * cfg.num_hidden_layers


@register("eagle3")
class Eagle3Drafter(LearnedDrafter):
    """EAGLE-3 for the decoding loop: K sequential single-row passes."""

    model_class: ClassVar[type] = Eagle3Model
    model: Eagle3Model

    def reset(self) -> None:
        self._cache = EagleRowCache()

    @torch.inference_mode()
    def draft_steps(
        self, ctx: DraftContext, forced_tokens: list[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens [K], q [K, V], draft logits [K, Vd]).  ``forced_tokens`` (tests) replaces
        the token fed to the next step."""
        m = self.model
        ids, feats = self.inputs(ctx)
        a = ids.numel() - 2  # the anchor row: verifier processed position a, emitted x[a+1] = ids[-1]
        dev = ids.device
        have = self._cache.valid_rows(ids, max_rows=a)  # the anchor row is always recomputed
        past = self._cache.kv or self._cache.empty(m, dev)

        # Pass 0: the step-0 rows new since last time (the anchor row last), all cached afterwards.
        rows = torch.arange(have, a + 1, device=dev)  # [n]
        keys = torch.arange(a + 1, device=dev)  # [have + n]
        vis0 = [self._visible(li, rows, keys) for li in range(len(m.layers))]
        h, kv = m.run_layers(
            m.embed_tokens(ids[rows + 1])[None, None], m.features(feats[rows])[None, None], (rows + 1)[None, None],
            [v[None, None] for v in vis0], past,
        )  # fmt: skip
        self._cache.append(ids, kv, rows.numel())
        step_logits, g = m.output(h[..., -1:, :])

        tokens, qs, logits_out = [], [], []
        spec: list[KV] | None = None  # this block's speculative rows, per layer; dropped at the end
        for s in range(self.num_speculative_tokens):
            logits = step_logits.reshape(-1)
            token, q = pick_tokens(to_target_vocab(logits[None], m.d2t, m.config.layer.vocab_size), ctx.sampling, ctx.generator)
            if forced_tokens is not None:
                token = torch.tensor([forced_tokens[s]], device=dev)
            tokens.append(token[0])
            qs.append(q[0])
            logits_out.append(logits)
            if s == self.num_speculative_tokens - 1:
                break
            # Step s+1: the anchor row again, fed the drafted token and its own output, at position a+2+s.
            # keys: every step-0 row (cached), this block's earlier speculative rows, this row
            past_s = extend_kv(self._cache.kv, spec) if spec is not None else self._cache.kv
            anchor = torch.tensor([a], device=dev)
            vis = [self._visible(li, anchor, keys, extra=s + 1)[None, None] for li in range(len(m.layers))]
            pos = torch.tensor([[[a + 2 + s]]], device=dev)
            h, kv = m.run_layers(m.embed_tokens(token)[None, None], g, pos, vis, past_s)
            spec = extend_kv(spec, kv)
            step_logits, g = m.output(h)
        return torch.stack(tokens), torch.stack(qs), torch.stack(logits_out)

    def _visible(self, layer_idx: int, rows: torch.Tensor, keys: torch.Tensor, extra: int = 0) -> torch.Tensor:
        """[len(rows), len(keys) + extra]: step-0 keys j <= row (within the window) plus ``extra``
        speculative keys of the same row, all visible."""
        vis = keys[None] <= rows[:, None]
        w = self.model.config.layer.window(layer_idx)
        if w is not None:
            vis = vis & (keys[None] > rows[:, None] - w)
        return torch.cat([vis, vis.new_ones(rows.numel(), extra)], dim=-1)

    def propose(self, ctx: DraftContext) -> Proposal:
        if ctx.token_ids.numel() < 2:  # the anchor row needs the verifier feature of the position before it
            return self.empty_proposal()
        tokens, q, _ = self.draft_steps(ctx)
        return Proposal(token_ids=tokens.tolist(), probs=q)
