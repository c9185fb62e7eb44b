"""DFlash: block-diffusion drafting, a whole block in one forward pass (arXiv 2602.06036).

A small Qwen3-style decoder drafts the block ``[anchor, MASK x (B-1)]`` at
positions ``p .. p+B-1``.  It conditions on the verifier through its KV cache:
the projected verifier feature ``C = hidden_norm(fc(aux taps))`` of every
context position ``j < p`` is turned into keys/values by each draft layer's
own k_proj/k_norm/RoPE and v_proj, so the context costs no query tokens.
Block tokens see all of that context and each other (bidirectionally in
full-attention layers), never other blocks.  Slot k predicts position ``p+k``
(slot 0 is the anchor itself and is unused), so one pass drafts B-1 tokens.

Embedding and LM head are the verifier's (not stored in the checkpoint).
DSpark (``specui.algorithms.dspark``) subclasses both classes here and adds two small heads.

Training layout: ``DFlashModel.forward_blocks`` (several anchored blocks over
one packed sequence).  Inference: ``DFlashDrafter.propose`` (drafter.py), which keeps each
layer's context K/V from step to step and extends it only by new positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from specui.algorithms.base import Borrowed, DraftModel, verifier_identity
from specui.algorithms.dflash.config import DFlashConfig
from specui.algorithms.dflash.options import DEFAULT_BLOCK_SIZE
from specui.algorithms.draft_config import DraftConfig
from specui.algorithms.layer_config import LayerConfig
from specui.algorithms.layers import (
    KV,
    DecoderLayer,
    RMSNorm,
    Rotary,
    draft_vocab_rows,
    register_vocab_map,
)
from specui.errors import SpecUIError


@dataclass
class BlockOutput:
    """Training-layout result for A anchored blocks of B slots."""

    hidden: torch.Tensor  # [A, B, H] final-normed hidden state of each slot
    logits: torch.Tensor  # [A, B, Vd] draft logits (draft vocabulary; Vd = V for a full vocabulary)
    layer_outputs: list[torch.Tensor]  # per layer [A, B, H], before the final norm


class DFlashModel(DraftModel):
    config_class: ClassVar[type[DraftConfig]] = DFlashConfig
    config: DFlashConfig

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = config
        cfg = config.layer
        H = cfg.hidden_size
        self.fc = nn.Linear(len(config.aux_layer_ids) * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        # Qwen3DFlashDecoderLayer always has q_norm/k_norm, whatever model_type says.
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, qk_norm=True) for _ in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta)
        register_vocab_map(self, cfg.vocab_size, config.draft_vocab_size)
        self.borrowed: Borrowed | None = None  # verifier embedding + LM head, set by bind_verifier

    # --- construction ------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        verifier: Any,
        *,
        num_layers: int = 2,
        block_size: int | None = None,
        num_speculative_tokens: int | None = None,
        aux_layer_ids: list[int] | None = None,
        mask_token_id: int | None = None,
        layer_types: list[str] | None = None,
        sliding_window: int | None = None,
        sliding_window_non_causal: bool = True,
        intermediate_size: int | None = None,
        draft_vocab: list[int] | torch.Tensor | None = None,
        seed: int | None = None,
        **options: Any,
    ) -> DFlashModel:
        """A randomly initialised drafter with the verifier's widths, ready to train.

        ``block_size`` (default DEFAULT_BLOCK_SIZE) or ``num_speculative_tokens`` K sets the
        block: K+1 slots (K with sample_from_anchor, DSpark's default).
        ``mask_token_id`` defaults to ``verifier.default_mask_token_id()`` (pick an unused
        special token where the tokenizer has one; never pad/eos).
        ``sliding_window_non_causal`` defaults to True so vLLM serves the block
        bidirectionally, the way full-attention layers are trained.
        ``draft_vocab``: target ids of a reduced draft vocabulary (d2t/t2d).
        ``options``: the config fields in ``config_class.create_options``
        (DSpark: markov_rank, markov_head_type, enable_confidence_head, ...).
        """
        unknown = set(options) - set(cls.config_class.create_options)
        if unknown:
            raise SpecUIError(
                f"unknown {cls.config_class.model_type} option(s): {', '.join(sorted(unknown))}"
            )
        from_anchor = options.get("sample_from_anchor", cls.config_class.sample_from_anchor)
        if num_speculative_tokens is not None:
            implied = num_speculative_tokens + (0 if from_anchor else 1)
            if block_size is not None and block_size != implied:
                raise SpecUIError(
                    f"block_size {block_size} does not give {num_speculative_tokens} speculative"
                    " tokens"
                )
            block_size = implied
        block_size = block_size or DEFAULT_BLOCK_SIZE
        aux = list(aux_layer_ids) if aux_layer_ids is not None else verifier.default_aux_layer_ids()
        verifier.check_aux_layer_ids(aux)
        mask = verifier.default_mask_token_id() if mask_token_id is None else mask_token_id
        if mask in verifier.eos_token_ids:
            raise SpecUIError(
                f"mask_token_id {mask} is an end-of-sequence token; choose an unused token"
            )
        layer = LayerConfig.like_verifier(
            verifier.config,
            "qwen3",
            num_layers,
            layer_types=layer_types or ["full_attention"] * num_layers,
            sliding_window=sliding_window,
            **({"intermediate_size": intermediate_size} if intermediate_size else {}),
        )
        config = cls.config_class(
            layer=layer,
            aux_layer_ids=aux,
            draft_vocab_size=len(draft_vocab) if draft_vocab is not None else verifier.vocab_size,
            num_speculative_tokens=block_size,
            block_size=block_size,
            mask_token_id=mask,
            sliding_window_non_causal=sliding_window_non_causal,
            **verifier_identity(verifier),
            **options,
        )
        if not config.sample_from_anchor:  # slot 0 only echoes the anchor
            config.num_speculative_tokens = block_size - 1
        model = cls.initialised(config, verifier, seed, draft_vocab)
        model.bind_verifier(verifier)
        return model.to(next(verifier.model.parameters()).device)

    def bind_verifier(self, verifier: Any) -> None:
        lm_head = verifier.lm_head
        if self.d2t is not None:  # reduced vocabulary: the verifier head's rows for kept tokens
            lm_head = nn.Linear(  # on meta: no random init, the rows replace its weight
                self.config.layer.hidden_size,
                self.config.draft_vocab_size,
                bias=False,
                device="meta",
            )
            lm_head.weight = nn.Parameter(
                draft_vocab_rows(verifier.lm_head.weight, self.d2t).detach().clone(),
                requires_grad=False,
            )
        self.borrowed = Borrowed(embed_tokens=verifier.embed_tokens, lm_head=lm_head)

    @classmethod
    def bound_elements(cls, config: DFlashConfig) -> int:
        """Elements ``bind_verifier`` adds to the model's own (the draft vocabulary's head rows),
        for a load's memory estimate (``specui.algorithms.serving.load_bytes``)."""
        if config.draft_vocab_size >= config.layer.vocab_size:
            return 0  # the verifier's head itself, not a copy
        return config.draft_vocab_size * config.layer.hidden_size

    def head_module(self) -> nn.Module | None:
        return None if self.borrowed is None else self.borrowed.lm_head

    def context_projection(self) -> tuple[nn.Module, RMSNorm]:
        return self.fc, self.hidden_norm

    def own_matmuls_outside(self) -> list[nn.Module]:
        """A draft vocabulary's copy of the verifier's head rows: the drafter's own, but outside
        its modules (so out of its checkpoint).  The full head is the verifier's, left alone."""
        if self.d2t is None or self.borrowed is None:
            return []
        return [self.borrowed.lm_head]

    # --- the pieces ----------------------------------------------------------------------

    # The verifier's weights are frozen here: detached, so training never
    # computes (or accumulates) gradients for the verifier's own parameters.
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        assert self.borrowed is not None, "bind_verifier() first"
        return F.embedding(ids, self.borrowed.embed_tokens.weight.detach()).float()

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        assert self.borrowed is not None, "bind_verifier() first"
        head = self.borrowed.lm_head
        if type(head) is not nn.Linear:  # switched to a kernel's layer (matmuls_in_bf16)
            return head(hidden)
        w = head.weight.detach()
        return F.linear(hidden, w if w.dtype == hidden.dtype else w.to(hidden.dtype))

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """Verifier taps [..., n_aux*H] -> draft context C [..., H] (the same for every layer)."""
        return self.hidden_norm(self.fc(features))

    def context_kv(self, layer: DecoderLayer, C: torch.Tensor, positions: torch.Tensor) -> KV:
        """C [N, T, H] at RoPE ``positions`` [N|1, T] -> this layer's context (k, v) [N, Hkv, T, D].

        Straight from C: no input_layernorm (the reference does not norm C again).
        """
        cos, sin = self.rotary(positions)
        return layer.self_attn.key_value(C, cos, sin)

    def sees_block(self, layer_idx: int) -> bool:
        """Whether a slot sees all of its block in this layer (bidirectional) or only the slots up
        to itself (a sliding layer, unless ``sliding_window_non_causal``)."""
        return self.config.layer.window(layer_idx) is None or self.config.sliding_window_non_causal

    def block_mask(self, layer_idx: int, B: int) -> torch.Tensor:
        """[B, B] which block slots a slot sees: all (bidirectional) or k' <= k (causal)."""
        full = torch.ones(B, B, dtype=torch.bool, device=self.hidden_norm.weight.device)
        return full if self.sees_block(layer_idx) else full.tril()

    def run_block(
        self,
        h: torch.Tensor,
        block_pos: torch.Tensor,
        ctx_kv: list[KV],
        ctx_visible: list[torch.Tensor],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """h [N, A, B, H] slot embeddings at ``block_pos`` [N|1, A, B]; per layer context K/V and
        visibility [N|1, A, B, T]  ->  (normed hidden [N, A, B, H], per-layer outputs)."""
        cos, sin = self.rotary(block_pos)
        outs = []
        for i, layer in enumerate(self.layers):
            own = self.block_mask(i, h.shape[-2])[None, None]  # [1, 1, B, B]
            h, _ = layer(h, cos, sin, own, ctx=ctx_kv[i], ctx_visible=ctx_visible[i])
            outs.append(h)
        return self.norm(h), outs

    # --- training layout -------------------------------------------------------------------

    def forward_blocks(
        self,
        features: torch.Tensor,
        input_ids: torch.Tensor,
        anchors: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> BlockOutput:
        """Draft A blocks anchored in one (packed) sequence, differentiably.

        features     [T, n_aux*H] (or [1, T, .]) verifier taps of every position,
                     ``cat(tap[l] for l in aux_layer_ids)`` -- unshifted.
        input_ids    [T] tokens x[0..T-1].
        anchors      [A] anchor positions p (the block is x[p], MASK, ...).
        position_ids [T] RoPE positions (default arange(T)); slot k of the block
                     anchored at p sits at position_ids[p] + k.
        document_ids [T] for packed sequences (default all 0; -1 = padding).

        Block at p sees context positions j < p of p's document (within the
        window for sliding layers), and its own slots.  Slot k's training
        target is the verifier's logits at ``target_positions(anchors)``.
        """
        T = input_ids.numel()
        ids = input_ids.reshape(T)
        feats = features.reshape(T, -1)
        dev = feats.device
        pos = position_ids.reshape(T) if position_ids is not None else torch.arange(T, device=dev)
        doc = (
            document_ids.reshape(T)
            if document_ids is not None
            else torch.zeros(T, dtype=torch.long, device=dev)
        )
        anchors = anchors.reshape(-1).to(dev)
        A, B = anchors.numel(), self.config.block_size

        block_ids = torch.full((A, B), self.config.mask_token_id, dtype=torch.long, device=dev)
        block_ids[:, 0] = ids[anchors]
        block_pos = pos[anchors][:, None] + torch.arange(B, device=dev)  # [A, B]

        C = self.context(feats)[None]  # [1, T, H]
        j = torch.arange(T, device=dev)
        sees = (
            (j[None] < anchors[:, None])
            & (doc[None] == doc[anchors][:, None])
            & (doc[anchors][:, None] >= 0)
        )  # [A, T]
        ctx_kv, ctx_vis = [], []
        for i, layer in enumerate(self.layers):
            ctx_kv.append(self.context_kv(layer, C, pos[None]))
            vis = sees
            window = self.config.layer.window(i)
            if window is not None:
                vis = vis & (j[None] >= anchors[:, None] - window)
            ctx_vis.append(vis[None, :, None, :].expand(1, A, B, T))  # same for every slot

        h = self.embed(block_ids)[None]  # [1, A, B, H]
        hidden, outs = self.run_block(h, block_pos[None], ctx_kv, ctx_vis)
        hidden = hidden[0]
        return BlockOutput(
            hidden=hidden, logits=self.lm_head(hidden), layer_outputs=[o[0] for o in outs]
        )

    def target_positions(
        self, anchors: torch.Tensor, seq_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """([A, B] position whose verifier logits are slot k's target, [A, B] bool trainable).

        Slot k predicts x[p+k] (target: verifier logits at p+k-1), or x[p+k+1]
        with sample_from_anchor (target at p+k).  Slot 0 of DFlash predicts the
        anchor itself and is never trained; targets past the sequence are invalid.
        """
        k = torch.arange(self.config.block_size, device=anchors.device)
        shift = 0 if self.config.sample_from_anchor else -1
        tgt = anchors.reshape(-1, 1) + k + shift
        valid = (tgt >= 0) & (
            tgt < seq_len - 1
        )  # logits at seq_len-1 predict a token not in the data
        if not self.config.sample_from_anchor:
            valid[:, 0] = False
        return tgt.clamp(0, seq_len - 1), valid
