"""Held-out evaluation: every ``eval_every`` steps, the drafter's metrics on samples of the prompt
set's held-out split, which no step trains on.

The training metrics come from the batch just trained on; these say how the drafter does on
prompts it has not seen (the expected acceptance length from per-position accuracy), so a long
run can be watched, and its checkpoints chosen, by data that is not its own.  The same samples
and the same anchors (one seeded generator a batch) every time: two evaluations differ by the
drafter alone.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specui.data.distill import TokenSample
from specui.data.hidden import HiddenStateStore, LocalExtractor
from specui.data.prompts import load_prompts
from specui.errors import SpecUIError
from specui.training.config import TrainConfig
from specui.training.data import cut_samples, responses

PREFIX = "heldout_"
BATCH = 4


class HeldOut:
    """The held-out samples of one run, their hidden states, and the objective that scores them."""

    def __init__(
        self, cfg: TrainConfig, verifier, objective, aux_layer_ids: list[int], cache_dir: Path
    ) -> None:
        prompts = load_prompts(cfg.prompts, split="eval", limit=cfg.eval_samples)
        if not prompts:
            raise SpecUIError(
                f"prompt set {cfg.prompts!r} has no held-out prompts to evaluate on; pass"
                " --eval-every 0"
            )
        # Their responses as training's: generated once, cached beside the training ones.
        samples = responses(cfg, verifier, prompts, cache_dir)
        self.samples: list[TokenSample] = [
            s for s in cut_samples(samples, cfg.max_seq_len) if objective.usable(s)
        ]
        extractor = LocalExtractor(verifier, aux_layer_ids, store=cfg.hidden_store)
        self.store = HiddenStateStore(extractor, self.samples, "mixed", cache_dir / "hidden")
        self.objective = objective

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """``heldout_<metric>`` for each of the objective's metrics (and its loss), averaged over
        the samples' batches."""
        if not self.samples:
            return {}
        was_training = model.training
        model.eval()
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        try:
            for i in range(0, len(self.samples), BATCH):
                batch = self.store.get(list(range(i, min(i + BATCH, len(self.samples)))))
                loss, metrics = self.objective.loss(
                    model, batch, torch.Generator().manual_seed(i), True
                )
                for k, v in {"loss": loss, **metrics}.items():
                    x = float(v)
                    if x == x:  # NaN: a metric this batch has none of
                        sums[k] = sums.get(k, 0.0) + x
                        counts[k] = counts.get(k, 0) + 1
        finally:
            model.train(was_training)
        return {PREFIX + k: sums[k] / counts[k] for k in sums}
