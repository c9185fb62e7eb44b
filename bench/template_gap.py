"""Where the shipped drafters' acceptance drops: trained prompts, new problems of the
training templates, held-out templates (gsm-symbolic; run by hand).

    .venv/bin/python bench/template_gap.py [--drafter dflash --drafter eagle3] [--prompts 8]
        [--tokens 96] [--trained 1000]

GSM-Symbolic splits by *template*: its held-out problems come from templates no drafter
saw.  ``--trained`` is how many training-split prompts the drafters were trained on (the
round-1 shipped drafters: the first 1000); the "new problems" are later training-split
prompts of templates among those, which no drafter was trained on.  Greedy, one torch
thread; tau is the mean acceptance length per prompt.

Measured 2026-11-29 (shipped round-1 drafters, 8 prompts x 96 tokens, 4 trained prompts):

    drafter  trained prompts  new problems, seen templates  held-out templates
    dflash   4.20             3.54                          2.07
    eagle3   4.47             3.99                          2.63

So the drafters generalise to new problems of the templates they saw, not to new
templates: more problems of the same templates would not move the held-out number.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from specui.algorithms.resolve import resolve_drafter
from specui.data import load_prompts
from specui.engine import generate
from specui.verifier.model import Verifier


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--drafter", action="append", default=None, help="shipped name or folder (repeatable)"
    )
    ap.add_argument(
        "--prompts", type=int, default=8, help="prompts per group (the trained group gets half)"
    )
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument(
        "--trained", type=int, default=1000, help="training-split prompts the drafters saw"
    )
    a = ap.parse_args()
    torch.set_num_threads(1)
    v = Verifier.load("embedded")
    train = load_prompts("gsm-symbolic", "train", limit=a.trained + 50 * a.prompts)
    seen, later = train[: a.trained], train[a.trained :]
    templates = {p.meta["template"] for p in seen}
    groups = {
        "trained prompts": seen[: max(1, a.prompts // 2)],
        "new problems, seen templates": [p for p in later if p.meta["template"] in templates][
            : a.prompts
        ],
        "held-out templates": load_prompts("gsm-symbolic", "eval", limit=a.prompts),
    }
    print(f"{'drafter':<10}" + "".join(f"{name:>32}" for name in groups))
    for choice in a.drafter or ["dflash", "eagle3"]:
        drafter = resolve_drafter(choice, v)
        cells = []
        for prompts in groups.values():
            taus = [
                generate(v, drafter, p.encode(v), max_new_tokens=a.tokens, seed=0).acceptance_length
                for p in prompts
            ]
            cells.append(f"{statistics.mean(taus):.2f} (n={len(taus)})")
        print(f"{choice:<10}" + "".join(f"{c:>32}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
