"""DSpark training: DFlash's anchored blocks plus the Markov and confidence heads.

* Draft distribution: the backbone logits plus the Markov bias (teacher-forced
  previous tokens); every slot, the anchor's too, is a proposal
  (``sample_from_anchor``), slot k predicting x[p+k+1].
* Loss: ``(1 - tv_weight) * CE + tv_weight * TV`` per slot with DFlash's
  position weights (TV is what speculative sampling's acceptance depends on),
  plus ``confidence_weight * BCE(confidence logit, 1 - TV(p_draft, p_target))``
  with the acceptance target detached.  ``1 - TV`` is the acceptance chance of
  speculative sampling at the temperature the distributions are taken at
  (``confidence_temperature``, default 1); at 0 both are one-hot on their
  argmax, so the target is "the argmaxes agree": greedy acceptance.
* Warm start: ``init_from`` a DFlash checkpoint copies the backbone; the heads
  start fresh (the Markov head at zero, i.e. as plain DFlash).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specui.algorithms.dflash.objective import DFlashObjective
from specui.algorithms.dspark.model import DSparkModel
from specui.algorithms.objective import Metrics, Targets, block_metrics, tv_distance, weighted_mean


class DSparkObjective(DFlashObjective):
    model_class = DSparkModel

    def create_options(self) -> dict:
        return {"markov_rank": self.cfg.options.markov_rank}

    def loss(
        self, model: DSparkModel, batch, gen: torch.Generator, metrics: bool = True
    ) -> tuple[torch.Tensor, Metrics]:
        _, _, out, targets, valid = self.blocks(model, batch, gen)
        logits = out.markov_logits  # [A, B, Vd]; all B slots are drafted
        ce, w = self.slot_loss(logits, targets, valid)
        tw = self.cfg.options.tv_weight
        needs_tv = tw > 0 or metrics or out.confidence_logits is not None
        tv = None
        if needs_tv:
            with torch.set_grad_enabled(
                tw > 0 and torch.is_grad_enabled()
            ):  # no graph for an unused TV
                tv = tv_distance(logits, targets)
        loss = (1 - tw) * ce + tw * weighted_mean(tv, w, valid) if tw > 0 else ce
        stats: Metrics = {}
        hit = (logits.detach().argmax(-1) == targets.top) & targets.valid
        if metrics:
            stats = block_metrics(hit, (1.0 - tv).detach(), valid, self.num_positions)
            stats["ce"] = ce.detach()
            stats["tv"] = weighted_mean(tv.detach(), torch.ones_like(w), valid)
        if out.confidence_logits is not None:
            accept = self.acceptance_target(logits.detach(), targets, tv.detach(), hit)
            bce = F.binary_cross_entropy_with_logits(
                out.confidence_logits.float(), accept, reduction="none"
            )
            conf_loss = weighted_mean(bce, w, valid)
            loss = loss + self.cfg.options.confidence_weight * conf_loss
            if metrics:
                with torch.no_grad():
                    m = valid.float()
                    prob = torch.sigmoid(out.confidence_logits.float())
                    stats["confidence_loss"] = conf_loss.detach()
                    stats["confidence_abs_error"] = (
                        (prob - accept).abs() * m
                    ).sum() / m.sum().clamp_min(1)
                    stats["confidence_mean"] = (prob * m).sum() / m.sum().clamp_min(1)
                    stats["accept_rate"] = (accept * m).sum() / m.sum().clamp_min(1)
        return loss, stats

    def acceptance_target(
        self, logits: torch.Tensor, targets: Targets, tv: torch.Tensor, hit: torch.Tensor
    ) -> torch.Tensor:
        """Each slot's analytic acceptance probability at ``confidence_temperature`` [A, B]."""
        t = self.cfg.options.confidence_temperature
        if t == 0:
            return hit.float()
        if t == 1:
            return 1.0 - tv  # already taken at temperature 1
        return 1.0 - tv_distance(logits, targets, temperature=t)
