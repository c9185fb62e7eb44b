"""Is DSpark's confidence head limited by its fit or by new prompts? (run by hand, not in CI)

    .venv/bin/python bench/confidence_probe.py [--drafter dspark] [--train-samples 300]
        [--heldout-prompts 12] [--cache-dir DIR]

The head is one linear map of ``[h_k; W1[prev_k]]`` (the checkpoint format fixes that).
This script refits that same linear map by logistic regression on the labels the
bar scores -- slot k's greedy draft equals the verifier's token, over slots whose
earlier slots all matched -- and compares AUROCs:

* features and labels are teacher-forced over every response position of
  self-distilled samples (at T=0 the slots up to the first rejection see exactly
  what decoding shows them, so this is the decoding-time population, with every
  position an anchor);
* "fit" samples: the training split the drafter was trained on (``gsm-symbolic,
  rg-math``); "held-out": the first ``--heldout-prompts`` of gsm-symbolic's
  held-out split (the bench's prompts; new templates);
* the shipped head is scored on both, then the refit (several L2 strengths).

If the refit gains on held-out prompts, the head is under-fitted; if it gains on
the fit data only, the limit is how the drafter's features carry over to new
templates, which a better head in this format cannot fix.

Measured 2026-11-30 with --cache-dir on the training cache and --heldout-prompts 36 (shipped
DSpark, round 2; 294 usable training samples of the first 300 -> 171,532 slots, 36 held-out
prompts -> 16,022 slots; one thread):

    head                    fit data AUROC   held-out AUROC
    shipped                 0.772            0.734
    draft top-1 prob        0.889            0.847
    refit, L2 1e-4          0.830            0.712
    refit, L2 1e-2          0.823            0.712
    refit, L2 1e-1          0.807            0.696

(held-out acceptance 0.65 of scored slots, fit data 0.82.)  The refit ranks the fit data
better and the held-out prompts worse: on these features the shipped head is not the
bottleneck.  But the drafter's own probability of its token ranks far better on both: the
features do carry the signal, just not linearly for a head fitted after the fact.  The
held-out AUROC here (0.73) is above the bench's 0.67 because every position is an anchor
here, while decoding anchors only where a step starts.

Can training put the signal where the linear head reads it?  The shipped drafter fine-tuned
400 more steps (lr 1e-4, seed 2, the same 3,000 training prompts) with the head learning greedy
acceptance (``specui train --algorithm dspark --init-from <round 2> --confidence-temperature 0``)
at BCE weight 1 and 4, the gradient reaching the whole drafter; probed with --train-samples 20:

    drafter                      head, fit data   head, held-out   draft top-1, held-out
    shipped (round 2)            0.772*           0.734            0.847
    + 400 steps, weight 1        0.805            0.720            0.849
    + 400 steps, weight 4        0.808            0.715            0.848
    (* on 300 training samples, the others on 20)

Again better on training prompts and worse on new templates: what holds the head down is how
its features carry over, which more of the same data does not fix.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specui.algorithms.checkpoint import load_model
from specui.algorithms.dspark.model import DSparkModel
from specui.algorithms.dspark.objective import DSparkObjective
from specui.algorithms.dspark.options import DSparkOptions
from specui.algorithms.layers import draft_target_ids
from specui.algorithms.resolve import shipped_drafters
from specui.data import load_prompts
from specui.data.distill import self_distill
from specui.data.hidden import HiddenStateStore, LocalExtractor
from specui.metrics.calibration import auroc
from specui.training.config import TrainConfig
from specui.verifier.model import Verifier


@torch.no_grad()
def slot_features(
    model, verifier: Verifier, samples, cache_dir: Path
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(features [N, H + r], greedy-match labels [N], the shipped head's logits [N], the
    drafter's own probability of its greedy token [N]) over the scored slots of every
    anchor of every sample.

    DSpark's own training objective lays out the blocks (``DSparkObjective.blocks``), with
    more anchors allowed than any sample has positions: every response position anchors."""
    options = DSparkOptions(block_size=model.config.block_size, max_anchors=1 << 30)
    cfg = TrainConfig(algorithm="dspark", options=options)
    objective = DSparkObjective(cfg, verifier)
    objective.draft_vocab = draft_target_ids(model.d2t)
    store = HiddenStateStore(
        LocalExtractor(verifier, model.config.aux_layer_ids), samples, "mixed", cache_dir / "hidden"
    )
    gen = torch.Generator().manual_seed(
        0
    )  # unused: no sample has more positions than anchors allowed
    feats, labels, logits, top_probs = [], [], [], []
    t0 = time.perf_counter()
    for i in range(len(samples)):
        _, anchors, out, targets, valid = objective.blocks(model, store.get([i]), gen)
        if anchors.numel() == 0:
            continue
        hit = out.markov_logits.argmax(-1) == targets.top
        earlier_hit = (
            torch.cat([torch.ones(len(anchors), 1, dtype=torch.bool), hit[:, :-1]], 1)
            .cumprod(1)
            .bool()
        )
        scored = valid & earlier_hit  # up to the first miss, as decoding scores them
        x = torch.cat([out.hidden, model.markov_head.markov_w1(out.prev_token_ids)], -1)
        feats.append(x[scored].numpy())
        labels.append(hit[scored].numpy())
        logits.append(out.confidence_logits[scored].numpy())
        top_probs.append(out.markov_logits.float().softmax(-1).amax(-1)[scored].numpy())
        if (i + 1) % 50 == 0:
            print(f"  {i + 1}/{len(samples)} samples, {time.perf_counter() - t0:.0f} s", flush=True)
    return (
        np.concatenate(feats),
        np.concatenate(labels),
        np.concatenate(logits),
        np.concatenate(top_probs),
    )


def fit_linear(
    x: np.ndarray, y: np.ndarray, l2: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logistic regression on standardised features: (weights, bias, mean, std)."""
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).float()
    mu, sd = xt.mean(0), xt.std(0) + 1e-6
    z = (xt - mu) / sd
    w = torch.zeros(x.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(z @ w + b, yt) + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), b.detach(), mu, sd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default="dspark", help="shipped name or a DSpark folder")
    ap.add_argument("--train-prompts", default="gsm-symbolic,rg-math")
    ap.add_argument("--train-samples", type=int, default=300)
    ap.add_argument("--heldout-prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument(
        "--cache-dir",
        default=str(Path.home() / ".cache" / "specui" / "probe"),
        help=(
            "self-distilled responses and hidden states (reuse the training cache to skip"
            " generation)"
        ),
    )
    ap.add_argument("--l2", default="1e-4,1e-2,1e-1")
    a = ap.parse_args()
    torch.set_num_threads(1)

    verifier = Verifier.load("embedded")
    path = shipped_drafters().get(a.drafter) or Path(a.drafter)
    model = load_model(path, verifier).eval()
    if not isinstance(model, DSparkModel) or model.confidence_head is None:
        raise SystemExit(f"{path} is not a DSpark drafter with a confidence head")
    cache = Path(a.cache_dir)
    data = {}
    for name, prompts in (
        ("fit data", load_prompts(a.train_prompts, split="train", limit=a.train_samples)),
        ("held-out", load_prompts("gsm-symbolic", split="eval", limit=a.heldout_prompts)),
    ):
        print(f"{name}: {len(prompts)} prompts", flush=True)
        samples = [
            s
            for s in self_distill(verifier, prompts, a.max_new_tokens, 16, cache)
            if len(s.response_ids) > model.config.block_size
        ]
        data[name] = slot_features(model, verifier, samples, cache)
        print(
            f"{name}: {len(data[name][1])} scored slots, acceptance {data[name][1].mean():.3f}",
            flush=True,
        )

    print(f"\n{'head':<22}{'fit data AUROC':>16}{'held-out AUROC':>16}")
    print(f"{'shipped':<22}" + "".join(f"{auroc(data[n][2], data[n][1]):>16.3f}" for n in data))
    # Not a head: the drafter's softmax probability of the token it drafts, the usual
    # uncertainty signal; it says how much a head that could read it would gain.
    print(
        f"{'draft top-1 prob':<22}"
        + "".join(f"{auroc(data[n][3], data[n][1]):>16.3f}" for n in data)
    )
    x_fit, y_fit = data["fit data"][:2]
    for l2 in (float(v) for v in a.l2.split(",")):
        w, b, mu, sd = fit_linear(x_fit, y_fit, l2)
        scores = {n: ((torch.from_numpy(d[0]) - mu) / sd @ w + b).numpy() for n, d in data.items()}
        print(
            f"{'refit, L2 ' + format(l2, 'g'):<22}"
            + "".join(f"{auroc(scores[n], data[n][1]):>16.3f}" for n in data)
        )


if __name__ == "__main__":
    main()
