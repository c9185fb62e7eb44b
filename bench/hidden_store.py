"""What the int8 hidden-state store costs: bytes a token, and the drafters' accuracy on it.

    PYTHONPATH=. .venv/bin/python bench/hidden_store.py [--source general|campaign] [--samples 16]
        [--algorithms dflash,dspark,eagle3,peagle] [--json]

The training campaign's corpus (~18 M sequence tokens) takes ~85 GB in the bf16 store and ~32 GB
in the int8 one (``specui.data.hidden.StoreFormat``).  Per shipped drafter, the same samples are
extracted in both stores and the drafter's training metrics (per-position accuracy, tau from
it) are computed on each with the same anchors (one seeded generator a batch), so the
difference is the store's alone.  ``--source campaign`` takes half long (> 480 prompt tokens)
and half short prompts with responses from the campaign's state folder
(``SPECUI_CAMPAIGN_DIR``); ``general`` takes the general corpus's training prompts with their
shipped responses, so it runs on any clone.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import torch

from specui.algorithms.checkpoint import load_model
from specui.algorithms.layers import draft_target_ids
from specui.algorithms.objective import objective_for
from specui.data import load_prompts
from specui.data.distill import (
    TokenSample,
    cached_responses,
    prompt_key,
    self_distill,
    verifier_fingerprint,
)
from specui.data.hidden import LocalExtractor, StoreFormat, read_sample
from specui.paths import shipped_data_dir
from specui.training import campaign
from specui.training.config import TrainConfig
from specui.verifier.model import Verifier

# The shipped drafters' training options the objective needs beside their config.json.
OPTIONS = {
    "dflash": {"block_size": 8, "max_anchors": 64},
    "dspark": {"block_size": 8, "max_anchors": 64, "markov_rank": 256},
    "eagle3": {"ttt_steps": 4},
    "peagle": {"num_depths": 8},
}


def campaign_samples(verifier: Verifier, n: int) -> list[TokenSample]:
    folder = campaign.state_dir()
    rows = campaign.campaign_rows(folder)
    cache = cached_responses(
        verifier_fingerprint(verifier), 256, verifier.eos_token_ids, [folder / "cache"]
    )
    random.Random(0).shuffle(rows)
    taken: dict[bool, list[TokenSample]] = {True: [], False: []}
    for r in rows:
        ids = tuple(campaign.row_prompt(r).encode(verifier))
        resp = cache.get(prompt_key(ids))
        group = taken[r["prompt_tokens"] > 480]
        if resp is not None and len(resp) >= 32 and len(group) < n // 2:
            group.append(TokenSample(r["id"], ids, tuple(resp)))
    out = taken[True] + taken[False]
    if len(out) < n:
        raise SystemExit(f"the campaign in {folder} has {len(out)} usable responses; want {n}")
    return out


def general_samples(verifier: Verifier, n: int) -> list[TokenSample]:
    # Shipped responses only (no generation): the training split's first n.
    return self_distill(verifier, load_prompts("general", split="train", limit=n), 128)


def metrics(objective, model, samples) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    with torch.no_grad():
        for i in range(0, len(samples), 4):
            _, m = objective.loss(model, samples[i : i + 4], torch.Generator().manual_seed(i))
            for k, x in m.items():
                sums.setdefault(k, []).append(float(x))
    return {k: sum(v) / len(v) for k, v in sums.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", choices=("general", "campaign"), default="general")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--algorithms", default="dflash,dspark,eagle3,peagle")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    verifier = Verifier.load("embedded")
    pick = campaign_samples if a.source == "campaign" else general_samples
    samples = pick(verifier, a.samples)
    tokens = sum(len(s) for s in samples)
    report: dict = {"samples": len(samples), "tokens": tokens, "drafters": {}}
    with tempfile.TemporaryDirectory(prefix="specui-hidden-store-") as tmp:
        for algo in a.algorithms.split(","):
            model = load_model(shipped_data_dir() / "drafters" / algo, verifier).eval()
            aux = list(model.config.aux_layer_ids)
            cfg = TrainConfig.from_dict(
                {
                    "algorithm": algo,
                    "layers": getattr(model.config, "num_hidden_layers", None),
                    "aux_layer_ids": aux,
                    "mask_token_id": getattr(model.config, "mask_token_id", None),
                    **OPTIONS[algo],
                }
            )
            objective = objective_for(cfg, verifier)
            d2t = getattr(model, "d2t", None)
            if d2t is not None:
                objective.draft_vocab = draft_target_ids(d2t)
            row = {}
            for store in StoreFormat:
                ex = LocalExtractor(verifier, aux, store=store)
                paths = ex.extract(samples, Path(tmp) / f"{algo}-{store}")
                read = [read_sample(p, len(aux)) for p in paths]
                row[store.value] = {
                    "bytes_per_token": sum(p.stat().st_size for p in paths) / tokens,
                    **metrics(objective, model, read),
                }
            report["drafters"][algo] = row
            if not a.json:
                b, q = row["bf16"], row["int8"]
                accs = [k for k in b if k.startswith("acc_")]
                print(
                    f"{algo:7s} bytes/token {b['bytes_per_token']:.0f} -> "
                    f"{q['bytes_per_token']:.0f}  tau {b['accept_len']:.3f} -> "
                    f"{q['accept_len']:.3f}  acc "
                    + " ".join(f"{b[k]:.3f}/{q[k]:.3f}" for k in accs)
                )
    if a.json:
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
