"""EAGLE-3 training: training-time test (TTT) over ``ttt_steps`` steps.

The batch is packed in the shifted EAGLE layout (row i: token x[i+1], verifier
taps of position i).  ``Eagle3Model.forward_ttt`` runs step 0 on the verifier
features and every later step on the draft's own previous output, teacher-forced
with the true tokens -- so the drafter learns from the features it will
actually see at inference.  Step s of row i predicts x[i+s+2]; its target is
the verifier's distribution there (soft KL, speculators' EAGLE-3 loss;
``extra={"loss": "ce"}`` for the hard CE).  The loss is the mean over steps of
each step's mean over its valid rows.
"""

from __future__ import annotations

import torch

from specui.drafters.eagle3 import Eagle3Model
from specui.training.objectives import (
    Metrics,
    Objective,
    block_metrics,
    pack_shifted,
    register_objective,
    slot_loss_fn,
    slot_stats,
)


@register_objective("eagle3")
class Eagle3Objective(Objective):
    @property
    def num_positions(self) -> int:  # type: ignore[override]
        return self.cfg.ttt_steps

    def build(self) -> Eagle3Model:
        cfg = self.cfg
        return Eagle3Model.create(
            self.verifier,
            num_layers=cfg.num_layers,
            num_speculative_tokens=cfg.ttt_steps,
            aux_layer_ids=cfg.aux_layer_ids,
            draft_vocab=self.draft_vocab,
            seed=cfg.seed,
        )

    def loss(self, model: Eagle3Model, batch, gen: torch.Generator) -> tuple[torch.Tensor, Metrics]:
        p = pack_shifted(batch)
        T, S = len(p), self.cfg.ttt_steps
        out = model.forward_ttt(p.hidden_states, p.input_ids, S, p.position_ids + 1, p.document_ids)
        targets = self.targets(p.last_hidden)  # [T', Vd]: row j predicts x[j+2]
        loss_fn = slot_loss_fn(self.cfg, "kl")
        i = torch.arange(T, device=targets.device)
        step_losses, hits, accepts, valids = [], [], [], []
        for s in range(S):
            j = (i + s).clamp(max=T - 1)  # step s of row i is scored against row i+s's target
            valid = (i + s < T) & (p.document_ids[j] == p.document_ids) & p.loss_mask[j].bool()
            per_row = loss_fn(out.logits[s], targets[j])
            step_losses.append((per_row * valid).sum() / valid.sum().clamp_min(1))
            hit, accept = slot_stats(out.logits[s].detach(), targets[j])
            hits.append(hit)
            accepts.append(accept)
            valids.append(valid)
        loss = torch.stack(step_losses).mean()
        metrics = block_metrics(torch.stack(hits, 1), torch.stack(accepts, 1), torch.stack(valids, 1), S)
        return loss, metrics
