"""DFlash training: random anchored blocks, position-decayed loss against the verifier.

Per batch (packed into one sequence):

1. anchors: up to ``max_anchors`` random response positions per document;
2. ``DFlashModel.forward_blocks`` drafts every block ``[x[p], MASK x (B-1)]``
   in one pass per document (context j < p, the block's own slots): a document
   never attends to another, so the packed batch's cross-document scores, most of
   them masked, are never computed (``packed_attention`` runs the old single pass);
3. targets: the verifier's stored top-k at ``model.target_positions`` -- slot k
   predicts x[p+k] (DSpark: x[p+k+1]) -- gathered, not recomputed;
4. loss: per-slot CE against the verifier's argmax (speculators' DFlash loss;
   ``loss="kl"`` for the soft KL), weighted ``exp(-(k-1)/gamma)``
   over drafted slots k = 1.., or by D-PACE.
"""

from __future__ import annotations

import torch

from specui.algorithms.dflash.model import DFlashModel
from specui.algorithms.objective import (
    Metrics,
    Objective,
    Packed,
    Targets,
    block_metrics,
    cat_outputs,
    pack,
    slot_loss_fn,
    slot_stats,
    weighted_mean,
)

# --- anchors and position weights ---------------------------------------------------------


def select_anchors(
    packed: Packed, block_size: int, max_anchors: int, gen: torch.Generator
) -> torch.Tensor:
    """Sorted anchor positions: up to ``max_anchors`` per document, drawn at random among
    response positions, leaving out each document's last ``block_size`` positions
    (a block there would run past the data), as speculators' ``select_anchors``."""
    chosen = []
    mask = packed.loss_mask.bool().cpu()
    for start, n in zip(packed.starts, packed.lengths, strict=True):
        cand = torch.nonzero(mask[start : start + max(0, n - block_size)]).flatten() + start
        if cand.numel() > max_anchors:
            cand = cand[torch.randperm(cand.numel(), generator=gen)[:max_anchors]]
        chosen.append(cand)
    anchors = torch.sort(torch.cat(chosen)).values
    return anchors.to(packed.input_ids.device)


def decay_weights(num_slots: int, gamma: float, device=None) -> torch.Tensor:
    """[S] DFlash weights ``exp(-(k-1)/gamma)`` for drafted slots k = 1..S."""
    k = torch.arange(num_slots, device=device, dtype=torch.float32)
    return torch.exp(-k / gamma)


@torch.no_grad()
def dpace_weights(slot_loss: torch.Tensor, mask: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """D-PACE: weight slot k by the expected number of accepted tokens it gates.

    ``slot_loss`` [A, S] per-slot CE, ``mask`` [A, S].  ``exp(-CE)`` estimates
    the chance slot k is right; a slot matters in proportion to how often the
    slots before it survive, summed over the slots it lets through:
    ``w_k = sum_{j>=k} prod_{i<=j} c_i`` with smoothed ``c = (1-a) exp(-CE) + a``.
    """
    m = mask.float()
    c = torch.where(m > 0, (1 - alpha) * torch.exp(-slot_loss.float()) + alpha, torch.ones_like(m))
    reach = torch.cumprod(c, -1) * m
    return torch.flip(torch.cumsum(torch.flip(reach, [-1]), -1), [-1]) * m


# --- the objective ----------------------------------------------------------------------


class DFlashObjective(Objective):
    model_class = DFlashModel

    @property
    def first_slot(self) -> int:
        """Slot 0 of DFlash predicts the anchor itself: drafted slots start at 1."""
        return 0 if self.model_class.config_class.sample_from_anchor else 1

    @property
    def num_positions(self) -> int:  # type: ignore[override]
        return self.cfg.options.block_size - self.first_slot

    def create_options(self) -> dict:
        return {}

    def build(self) -> DFlashModel:
        cfg = self.cfg
        return self.model_class.create(
            self.verifier,
            num_layers=cfg.num_layers,
            block_size=cfg.options.block_size,
            aux_layer_ids=cfg.aux_layer_ids,
            mask_token_id=cfg.mask_token_id,
            draft_vocab=self.draft_vocab,
            seed=cfg.seed,
            **self.create_options(),
        )

    def usable(self, sample) -> bool:
        # The first response token must be able to anchor a whole block.
        return len(sample.response_ids) > self.cfg.options.block_size

    def forward(self, model: DFlashModel, packed: Packed, anchors: torch.Tensor):
        """The model's blocks for ``anchors``: one pass per document (or one packed pass)."""
        if self.packed_attention:
            return model.forward_blocks(
                packed.hidden_states,
                packed.input_ids,
                anchors,
                packed.position_ids,
                packed.document_ids,
            )
        outs = []
        for doc in packed.documents():
            mine = anchors[
                (anchors >= doc.start) & (anchors < doc.stop)
            ]  # sorted: documents in order
            if mine.numel():
                outs.append(
                    model.forward_blocks(
                        packed.hidden_states[doc],
                        packed.input_ids[doc],
                        mine - doc.start,
                        packed.position_ids[doc],
                    )
                )
        return cat_outputs(outs)

    def blocks(self, model: DFlashModel, batch, gen: torch.Generator):
        """Shared by DSpark: (packed batch, anchors, model output, targets [A, B], valid [A, B])."""
        packed: Packed = pack(batch)
        anchors = select_anchors(
            packed, self.cfg.options.block_size, self.cfg.options.max_anchors, gen
        )
        out = self.forward(model, packed, anchors)
        T, B = len(packed), self.cfg.options.block_size
        tgt_pos, valid = model.target_positions(anchors, T)
        # The slot predicts the token after tgt_pos: it must lie in the anchor's document.
        nxt = (tgt_pos + 1).clamp(max=T - 1)
        valid = valid & (packed.document_ids[nxt] == packed.document_ids[anchors][:, None])
        # speculators' aligned loss mask: the mask at the slot's own position p+k (DFlash: the
        # predicted token; DSpark: the token before it, as EAGLE masks by input token).
        slot_pos = (anchors[:, None] + torch.arange(B, device=anchors.device)).clamp(max=T - 1)
        valid = valid & packed.loss_mask[slot_pos].bool()
        targets = self.targets(
            packed.target_ids[tgt_pos], packed.target_logprobs[tgt_pos]
        )  # [A, B, k]
        return packed, anchors, out, targets, valid & targets.valid

    def slot_loss(
        self, logits: torch.Tensor, targets: Targets, valid: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(weighted mean loss, position weights [A|1, S]) over drafted slots."""
        S = logits.shape[1]
        per_slot = slot_loss_fn(self.cfg, "ce")(logits, targets)  # [A, S]
        if self.cfg.options.dpace:
            w = dpace_weights(per_slot.detach(), valid)
        else:
            w = decay_weights(S, self.cfg.options.gamma, logits.device)[None]
        return weighted_mean(per_slot, w, valid), w

    def loss(
        self, model: DFlashModel, batch, gen: torch.Generator, metrics: bool = True
    ) -> tuple[torch.Tensor, Metrics]:
        _, _, out, targets, valid = self.blocks(model, batch, gen)
        f = self.first_slot
        logits, targets, valid = out.logits[:, f:], targets[:, f:], valid[:, f:]
        loss, _ = self.slot_loss(logits, targets, valid)
        if not metrics:
            return loss, {}
        stats = block_metrics(*slot_stats(logits.detach(), targets), valid, self.num_positions)
        stats["anchors"] = torch.tensor(float(valid.shape[0]))
        return loss, stats
