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
Inference: ``Eagle3Drafter.propose`` (drafter.py) -- step-0 rows of committed positions
are cached per layer and extended incrementally; the speculative steps'
entries are dropped after each block.

P-EAGLE (``specui.algorithms.peagle``) reuses this model, its drafter and its
objective's shifted layout, and adds ``mask_hidden``: this package is the one
place the EAGLE family's shared code lives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from specui.algorithms.base import DraftModel, verifier_identity
from specui.algorithms.draft_config import DraftConfig
from specui.algorithms.eagle3.config import Eagle3Config
from specui.algorithms.layer_config import LayerConfig
from specui.algorithms.layers import (
    KV,
    DecoderLayer,
    RMSNorm,
    Rotary,
    draft_vocab_rows,
    extend_kv,
    project_features,
    register_vocab_map,
)
from specui.errors import SpecUIError


@dataclass
class TTTOutput:
    """Training-layout result of S TTT steps over T' rows."""

    logits: (
        torch.Tensor
    )  # [S, T', Vd]; logits[s, i] predicts x[i+s+2] (target: verifier logits at i+s+1)
    hidden: torch.Tensor  # [S, T', H] last-layer output of each step (normed when norm_output)


class Eagle3FirstLayer(DecoderLayer):
    """EAGLE-3's first layer: q/k/v read ``[input_layernorm(embed); hidden_norm(feature)]`` (2H).

    Its input is that concatenation, unnormed.  The residual stream starts from
    the feature half only -- normed when ``norm_before_residual`` -- so the
    token embedding steers attention but is not added to the stream.
    """

    def __init__(self, cfg: LayerConfig, qk_norm: bool, norm_before_residual: bool) -> None:
        super().__init__(cfg, qk_norm, in_features=2 * cfg.hidden_size)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def attn_input(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embeds, feature = h.chunk(2, dim=-1)  # each [..., H]
        normed = self.hidden_norm(feature)
        residual = normed if self.norm_before_residual else feature
        return torch.cat([self.input_layernorm(embeds), normed], dim=-1), residual


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
        self.fc_norm = (
            nn.ModuleList(RMSNorm(H, cfg.rms_norm_eps) for _ in range(n_aux))
            if config.fc_norm
            else None
        )
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
        "norm_before_fc": True,
        "norm_output": True,
        "norm_before_residual": True,
    }

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
            raise SpecUIError(
                f"unknown {cls.config_class.model_type} option(s): {', '.join(sorted(unknown))}"
            )
        aux = list(aux_layer_ids) if aux_layer_ids is not None else verifier.default_aux_layer_ids()
        verifier.check_aux_layer_ids(aux)
        n = num_layers or cls.default_layers
        layer = LayerConfig.like_verifier(
            verifier.config,
            model_type or cls.default_model_type,
            n,
            layer_types=layer_types or ["full_attention"] * n,
            sliding_window=sliding_window,
            **({"intermediate_size": intermediate_size} if intermediate_size else {}),
        )
        config = cls.config_class(
            layer=layer,
            aux_layer_ids=aux,
            draft_vocab_size=len(draft_vocab) if draft_vocab is not None else verifier.vocab_size,
            num_speculative_tokens=num_speculative_tokens or cls.default_k,
            **verifier_identity(verifier),
            **(cls.default_options | cls.create_defaults(verifier) | options),
        )
        model = cls.initialised(config, verifier, seed, draft_vocab)
        with torch.no_grad():
            for key in cls.verifier_fallback:
                model.get_parameter(key).copy_(model.fallback_tensor(key, verifier))
        return model.to(next(verifier.model.parameters()).device)

    @classmethod
    def create_defaults(cls, verifier: Any) -> dict[str, Any]:
        return {}

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
        pos0 = (
            position_ids.reshape(T)
            if position_ids is not None
            else torch.arange(1, T + 1, device=dev)
        )
        doc = (
            document_ids.reshape(T)
            if document_ids is not None
            else torch.zeros(T, dtype=torch.long, device=dev)
        )

        i = torch.arange(T, device=dev)
        base = (
            (i[None] <= i[:, None]) & (doc[None] == doc[:, None]) & (doc[:, None] >= 0)
        )  # [T', T'] step-0 keys
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
            h, kv = self.run_layers(
                self.embed_tokens(tok)[None, None], g, (pos0 + s)[None, None], visible, past
            )
            past = extend_kv(past, kv)
            step_logits, g = self.output(h)
            logits.append(step_logits[0, 0])
            hiddens.append(g[0, 0])
        return TTTOutput(logits=torch.stack(logits), hidden=torch.stack(hiddens))
