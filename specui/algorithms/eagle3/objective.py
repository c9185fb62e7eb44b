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

from specui.algorithms.eagle3.model import Eagle3Model
from specui.data.hidden import SampleTensors
from specui.training.objectives import (
    Metrics,
    Objective,
    Packed,
    block_metrics,
    pack,
    slot_loss_fn,
    slot_stats,
)


def pack_shifted(batch: list[SampleTensors]) -> Packed:
    """The EAGLE layout (speculators' ``shift_batch``), packed: row i of a document
    holds token x[i+1], the verifier taps of position i, the pre-norm last layer
    of position i+1 (its logits predict x[i+2]) and the loss mask of x[i+1]
    (rows whose input token is a response token: the rows drafting starts from)."""
    shifted = [
        SampleTensors(
            input_ids=s.input_ids[1:], hidden_states=s.hidden_states[:-1],
            last_hidden=s.last_hidden[1:], loss_mask=s.loss_mask[1:],
        )  # fmt: skip
        for s in batch
    ]
    return pack(shifted)


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
