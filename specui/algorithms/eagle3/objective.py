"""EAGLE-3 training: training-time test (TTT) over ``ttt_steps`` steps.

The batch is packed in the shifted EAGLE layout (row i: token x[i+1], verifier
taps of position i).  ``Eagle3Model.forward_ttt`` runs step 0 on the verifier
features and every later step on the draft's own previous output, teacher-forced
with the true tokens -- so the drafter learns from the features it will
actually see at inference.  Step s of row i predicts x[i+s+2]; its target is
the verifier's distribution there (soft KL, speculators' EAGLE-3 loss;
``loss="ce"`` for the hard CE).  The loss is the mean over steps of
each step's mean over its valid rows.
"""

from __future__ import annotations

import torch

from specui.algorithms.eagle3.model import Eagle3Model
from specui.algorithms.objective import (
    Metrics,
    Objective,
    Packed,
    block_metrics,
    pack,
    slot_loss_fn,
    slot_stats,
)
from specui.data.hidden import SampleTensors


def pack_shifted(batch: list[SampleTensors]) -> Packed:
    """The EAGLE layout (speculators' ``shift_batch``), packed: row i of a document
    holds token x[i+1], the verifier taps of position i, the verifier's targets
    after position i+1 (they predict x[i+2]) and the loss mask of x[i+1]
    (rows whose input token is a response token: the rows drafting starts from)."""
    shifted = [
        SampleTensors(
            input_ids=s.input_ids[1:],
            hidden_states=s.hidden_states[:-1],
            target_ids=s.target_ids[1:],
            target_logprobs=s.target_logprobs[1:],
            loss_mask=s.loss_mask[1:],
        )
        for s in batch
    ]
    return pack(shifted)


class Eagle3Objective(Objective):
    @property
    def num_positions(self) -> int:  # type: ignore[override]
        return self.cfg.options.ttt_steps

    def build(self) -> Eagle3Model:
        cfg = self.cfg
        return Eagle3Model.create(
            self.verifier,
            num_layers=cfg.num_layers,
            num_speculative_tokens=cfg.options.ttt_steps,
            aux_layer_ids=cfg.aux_layer_ids,
            draft_vocab=self.draft_vocab,
            seed=cfg.seed,
        )

    def forward(self, model: Eagle3Model, p: Packed, S: int):
        """TTT logits [S, T', Vd]: one pass per document, whose keys are only its own rows
        (``packed_attention``: the whole packed batch in one masked pass, the old path)."""
        if self.packed_attention:
            return model.forward_ttt(
                p.hidden_states, p.input_ids, S, p.position_ids + 1, p.document_ids
            ).logits
        outs = [
            model.forward_ttt(
                p.hidden_states[doc], p.input_ids[doc], S, p.position_ids[doc] + 1
            ).logits
            for doc in p.documents()
        ]
        return torch.cat(outs, dim=1)

    def loss(
        self, model: Eagle3Model, batch, gen: torch.Generator, metrics: bool = True
    ) -> tuple[torch.Tensor, Metrics]:
        p = pack_shifted(batch)
        T, S = len(p), self.cfg.options.ttt_steps
        logits = self.forward(model, p, S)
        i = torch.arange(T, device=p.input_ids.device)
        # Step s of row i is scored against row i+s's target: one gather of all steps' targets.
        j = (i[None] + torch.arange(S, device=i.device)[:, None]).clamp(max=T - 1)  # [S, T']
        targets = self.targets(p.target_ids[j], p.target_logprobs[j])  # [S, T', k]
        valid = (i[None] + torch.arange(S, device=i.device)[:, None] < T) & (
            p.document_ids[j] == p.document_ids[None]
        )
        valid = valid & p.loss_mask[j].bool() & targets.valid
        per_row = slot_loss_fn(self.cfg, "kl")(logits, targets)  # [S, T']
        loss = ((per_row * valid).sum(-1) / valid.sum(-1).clamp_min(1)).mean()
        if not metrics:
            return loss, {}
        hit, accept = slot_stats(logits.detach(), targets)
        return loss, block_metrics(hit.T, accept.T, valid.T, S)
