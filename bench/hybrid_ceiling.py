"""How many tokens a step a hybrid of a lookup and a learned drafter could make at best, at T=0.
By hand:

    .venv/bin/python bench/hybrid_ceiling.py [--prompts spec-bench] [--limit 48]
        [--lookup ngram --lookup suffix] [--learned dflash --learned SPECULATOR_FOLDER ...]

Greedy output does not depend on the drafter, so each prompt is decoded once (plain, the
default precision), and every proposer then drafts from every position of that output: the
tokens it would have had accepted there (the longest prefix of its draft that the output
continues with) is known for each position, whatever path a run would take.  From those, walks
over the output give each proposer's tokens per step alone (drafting every step), the hybrid's
fixed rule (the lookup's draft when it has one, else the learned one), and the **ceiling**: a
step that always sends the better of the two drafts.  No per-step choice between the two can do
better, and a verify of both drafts as a two-branch tree would make exactly the ceiling.

Issue 52's bar (the best hybrid's tokens per step >= 1.3x the better of its two parts) can be
met only where the ceiling is above it.  The taps the learned drafters read come from one
forward of the whole sequence (a run's come block by block; the two differ by rounding).
Nothing here is timed, so the campaign need not be paused.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from specui.algorithms.base import DraftContext, Drafter  # noqa: E402
from specui.benchmark import bench_prompts  # noqa: E402
from specui.engine import Decoding  # noqa: E402
from specui.trace import SamplingParams  # noqa: E402
from specui.verifier.model import Verifier  # noqa: E402
from specui.workbench import WORKBENCH  # noqa: E402


def accepted(draft: list[int], truth: list[int]) -> int:
    """The greedy verify's accepted count: the longest prefix of ``draft`` in ``truth``."""
    n = 0
    for d, t in zip(draft, truth, strict=False):
        if d != t:
            break
        n += 1
    return n


def accepted_by_position(
    drafter: Drafter, seq: list[int], start: int, features: torch.Tensor | None
) -> tuple[list[int], list[bool]]:
    """Accepted counts of ``drafter``'s draft from each position ``start .. len(seq) - 2`` (the
    committed sequence ends at that position; the rest of ``seq`` is the truth), and whether it
    drafted anything there."""
    drafter.reset()
    ids = torch.tensor(seq, dtype=torch.long)
    out, drafted = [], []
    for t in range(start, len(seq) - 1):
        ctx = DraftContext(
            token_ids=ids[: t + 1],
            features=None if features is None else features[:t],
            sampling=SamplingParams(),
            generator=None,
        )
        draft = drafter.propose(ctx).token_ids
        out.append(accepted(draft, seq[t + 1 :]))
        drafted.append(bool(draft))
    return out, drafted


def steps(acc: list[int]) -> int:
    """Verify steps of a walk that takes ``acc[i] + 1`` tokens a step from position i."""
    i = n = 0
    while i < len(acc):
        i += acc[i] + 1
        n += 1
    return n


def taps(v: Verifier, seq: list[int], layer_ids: list[int]) -> torch.Tensor:
    """The aux taps of every position of ``seq`` but the last, in one forward."""
    out = v.forward(
        torch.tensor(seq[:-1], dtype=torch.long), v.new_cache(), layer_ids, logits=False
    )
    return out.aux_hidden.float()


def ratio_interval(
    num: list[int], den: list[int], tokens: list[int], resamples: int = 2000
) -> tuple[float, float]:
    """95% bootstrap interval over prompts of (tokens/num steps) / (tokens/den steps)."""
    rng = random.Random(0)
    n = len(num)
    vals = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        vals.append(sum(den[i] for i in idx) / max(1, sum(num[i] for i in idx)))
    vals.sort()
    return vals[int(0.025 * resamples)], vals[int(0.975 * resamples)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default="spec-bench")
    ap.add_argument("--limit", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--precision", default=None)
    ap.add_argument("--lookup", action="append", help="repeatable (default: ngram, suffix)")
    ap.add_argument("--learned", action="append", help="repeatable (default: the four shipped)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lookups = args.lookup or ["ngram", "suffix"]
    learned = args.learned or ["dflash", "dspark", "eagle3", "peagle"]
    v = WORKBENCH.verifier("embedded", args.precision)
    prompts = bench_prompts(args.prompts, args.limit)
    # acc[name][prompt] = accepted count from each position; tokens[prompt] = positions walked
    acc: dict[str, list[list[int]]] = defaultdict(list)
    drafted: dict[str, list[list[bool]]] = defaultdict(list)
    groups: list[str] = []
    with ExitStack() as stack:
        plain = stack.enter_context(WORKBENCH.drafter("none", v, None))
        drafters = {n: stack.enter_context(WORKBENCH.drafter(n, v, None)) for n in lookups}
        drafters |= {n: stack.enter_context(WORKBENCH.drafter(n, v, None)) for n in learned}
        layer_ids = sorted({i for d in drafters.values() for i in d.aux_layer_ids or ()})
        for p in tqdm(prompts, desc="prompts", unit="prompt"):
            ids = p.encode(v)
            out = Decoding(
                v, plain, ids, max_new_tokens=args.max_new_tokens, sampling=SamplingParams()
            )
            for _ in out:
                pass
            seq = ids + out.result.output_token_ids
            start = len(ids)  # the prefill emitted the first output token
            all_taps = taps(v, seq, layer_ids) if layer_ids else None
            for name, d in drafters.items():
                feats = None
                if d.aux_layer_ids:  # this drafter's taps, in its own order
                    per_layer = all_taps.view(all_taps.shape[0], len(layer_ids), -1)
                    pick = [layer_ids.index(i) for i in d.aux_layer_ids]
                    feats = per_layer[:, pick].reshape(all_taps.shape[0], -1)
                a, had = accepted_by_position(d, seq, start, feats)
                acc[name].append(a)
                drafted[name].append(had)
            groups.append(p.meta.get("group") or "all")

    tokens = [len(a) for a in acc[lookups[0]]]
    total = sum(tokens)

    def line(label: str, st: list[int], against: list[int] | None = None) -> str:
        s = f"{label:<28} {total / sum(st):.3f} tokens a step"
        if against is not None:
            lo, hi = ratio_interval(st, against, tokens)
            s += f"  {sum(against) / sum(st):.3f}x the better part [{lo:.3f}, {hi:.3f}]"
        return s

    alone = {n: [steps(a) for a in acc[n]] for n in acc}
    print(f"{len(prompts)} prompts of {args.prompts}, {total} positions, T=0")
    for n, st in alone.items():
        k = drafters[n].num_speculative_tokens
        print(line(f"{n} (K {k})", st))
    ceilings: dict[tuple[str, str], list[int]] = {}  # (lookup, learned) -> steps by prompt
    for lk in lookups:
        for ln in learned:
            better = min((lk, ln), key=lambda n: sum(alone[n]))
            first = [
                steps([a if had else b for a, b, had in zip(x, y, z, strict=True)])
                for x, y, z in zip(acc[lk], acc[ln], drafted[lk], strict=True)
            ]
            ceilings[lk, ln] = [
                steps([max(a, b) for a, b in zip(x, y, strict=True)])
                for x, y in zip(acc[lk], acc[ln], strict=True)
            ]
            print(line(f"{ln}+{lk} lookup first", first, alone[better]))
            print(line(f"{ln}+{lk} ceiling", ceilings[lk, ln], alone[better]))
    by_group: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        by_group[g].append(i)
    if len(by_group) > 1:
        # Each proposer's own tokens a step by group: where a drafter trained further gained.
        print("by group, each proposer alone (tokens a step):")
        for g, idx in by_group.items():
            parts = [
                f"{n} {sum(tokens[i] for i in idx) / sum(alone[n][i] for i in idx):.3f}"
                for n in alone
            ]
            print(f"  {g:<16} " + ", ".join(parts))
        print("by group, the ceiling of each learned drafter with the first lookup:")
        for g, idx in by_group.items():
            parts = []
            for ln in learned:
                ceil = sum(ceilings[lookups[0], ln][i] for i in idx)
                best = min(sum(alone[n][i] for i in idx) for n in (lookups[0], ln))
                parts.append(f"{ln} {best / ceil:.2f}x")
            print(f"  {g:<16} " + ", ".join(parts))


if __name__ == "__main__":
    main()
