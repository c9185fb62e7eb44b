"""P-EAGLE training: parallel rollouts with draft-block sparsification.

The batch is packed in the shifted EAGLE layout.  Every row is a depth-0 row
(it is also the context the deeper rows read); depth d >= 1 keeps about
``max(r^d, r_min)`` of the rows, drawn from the chains that survived depth
d-1 (``cod_rows``, applied per document), so a long
sequence costs ~3-4x its length in rows instead of K times.
``PEagleModel.forward_rows`` runs all kept rows in one pass with the rollout
mask; row (a, d) predicts x[a+d+2] against the verifier's distribution there
(soft KL by default).
"""

from __future__ import annotations

import torch

from specui.algorithms.eagle3.objective import pack_shifted
from specui.algorithms.objective import (
    Metrics,
    Objective,
    block_metrics,
    cat_outputs,
    slot_loss_fn,
    slot_stats,
)
from specui.algorithms.peagle.model import PEagleModel


def cod_rows(
    loss_mask: torch.Tensor,
    num_depths: int,
    ratio: float = 0.7,
    ratio_min: float = 0.2,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft block sparsification: which (anchor, depth) rows to train, as (row_anchor, row_depth).

    ``loss_mask`` [T'] (shifted layout) marks the rows whose targets count.
    Depth 0 keeps every row.  Depth d keeps about ``max(ratio^d, ratio_min)``
    of the trainable rows, drawn from the chains that survived depth d-1 and
    whose position a+d is trainable -- so every kept row has its whole rollout
    (the speculators sampler, written out).
    """
    mask = loss_mask.reshape(-1).bool().cpu()
    T = mask.numel()
    valid = torch.nonzero(mask).reshape(-1)
    anchors, depths = [torch.arange(T)], [torch.zeros(T, dtype=torch.long)]
    pos = valid[valid >= 1]  # depth-1 positions a+1 of chains with an anchor a >= 0
    for depth in range(1, num_depths):
        want = int(max(valid.numel() - depth, 0) * max(ratio**depth, ratio_min))
        if want <= 0 or pos.numel() == 0:
            break
        if pos.numel() > want:
            pos = pos[torch.randperm(pos.numel(), generator=generator)[:want]].sort().values
        anchors.append(pos - depth)
        depths.append(torch.full_like(pos, depth))
        nxt = pos + 1  # the same chain one depth further
        pos = nxt[(nxt < T) & torch.isin(nxt, valid)]
    return torch.cat(anchors), torch.cat(depths)


class PEagleObjective(Objective):
    @property
    def num_positions(self) -> int:  # type: ignore[override]
        return self.cfg.options.num_depths

    def build(self) -> PEagleModel:
        cfg = self.cfg
        options: dict = (
            {"mask_token_id": cfg.mask_token_id} if cfg.mask_token_id is not None else {}
        )
        if cfg.options.freeze_embeddings:
            options["embed_requires_grad"] = False
        return PEagleModel.create(
            self.verifier,
            num_layers=cfg.num_layers,
            num_speculative_tokens=cfg.options.num_depths,
            aux_layer_ids=cfg.aux_layer_ids,
            draft_vocab=self.draft_vocab,
            seed=cfg.seed,
            **options,
        )

    def loss(
        self, model: PEagleModel, batch, gen: torch.Generator, metrics: bool = True
    ) -> tuple[torch.Tensor, Metrics]:
        p = pack_shifted(batch)
        K, dev = self.cfg.options.num_depths, p.input_ids.device
        anchors, depths, outs = [], [], []
        for doc in p.documents():
            a, d = cod_rows(
                p.loss_mask[doc], K, self.cfg.options.cod_ratio, self.cfg.options.cod_min_ratio, gen
            )
            a, d = a.to(dev), d.to(dev)
            if not self.packed_attention:  # each document's rows attend only to its own rows
                outs.append(model.forward_rows(p.hidden_states[doc], p.input_ids[doc], a, d))
            anchors.append(a + doc.start)
            depths.append(d)
        row_a, row_d = torch.cat(anchors), torch.cat(depths)
        if self.packed_attention:
            out = model.forward_rows(p.hidden_states, p.input_ids, row_a, row_d, p.document_ids)
        else:
            out = cat_outputs(outs)
        q = row_a + row_d  # the row's own shifted index: its target is the verifier there
        targets = self.targets(p.target_ids[q], p.target_logprobs[q])  # [R, k]
        valid = p.loss_mask[q].bool() & targets.valid
        per_row = slot_loss_fn(self.cfg, "kl")(out.logits, targets)
        loss = (per_row * valid).sum() / valid.sum().clamp_min(1)
        if not metrics:
            return loss, {}

        # Metrics on a grid [anchor, depth]: only rollouts kept at every depth give tau.
        hit, accept = slot_stats(out.logits.detach(), targets)
        grid = torch.zeros(len(p), K, dtype=torch.bool, device=dev)
        g_hit, g_acc = grid.clone(), torch.zeros(len(p), K, device=dev)
        grid[row_a, row_d] = valid
        g_hit[row_a, row_d] = hit
        g_acc[row_a, row_d] = accept
        stats = block_metrics(g_hit, g_acc, grid, K)
        stats["rows"] = torch.tensor(float(row_a.numel()))
        return loss, stats
