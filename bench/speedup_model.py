"""What tau each drafter needs for a given speedup on this CPU (run by hand, not in CI).

    .venv/bin/python bench/speedup_model.py [--threads 1,2] [--repeats 15] [--context 256]
        [--ks 3,5,7,8] [--vocabs 4096,8192,16384,full] [--target 1.5] [--precision fp32|bf16]

Three measurements on the embedded verifier (SmolLM2-135M-Instruct, in ``--precision``):

1. ``t1``: one plain decoding step, ``Verifier.forward`` of one token after a
   cached context (what plain decoding pays per output token, without aux taps);
2. ``tv(K)``: verifying a block ``[last, d_1..d_K]`` of K+1 tokens after the same
   context, with the aux taps the learned drafters need (what a speculative step
   pays), the cache cropped back after each call as the engine does;
3. ``td``: one ``propose`` of each drafter (randomly initialised: cost does not
   depend on the weights) at the sizes of ``--layers``, with the full
   49,152-token draft vocabulary and with reduced ones (d2t/t2d), in steady
   state (one more committed token per call, the drafters' caches warm).

A speculative step emits tau tokens on average for ``tv(K) + td``; plain
decoding emits one per ``t1``.  Ignoring engine bookkeeping (sampling,
acceptance, cache crop -- small next to the forwards), the speedup is
``tau * t1 / (tv(K) + td)``, so the tau a target speedup S needs is

    tau_needed = S * (tv(K) + td) / t1

which must not exceed K+1 (the most a block can give).  Timings are medians of
``--repeats`` calls taken in turns, so a burst of load from another process hits
all variants alike.  With two cores and other jobs running, the 2-thread figures
swing; the 1-thread ones are the ones to plan with.

Measured 2026-11-29 on the project's 2-core CPU machine with other jobs running
(two 1-thread runs, load average 2-3 and 5; K=7, draft vocabulary 4096):
t1 = 92-103 ms; tv(K)/t1 = 1.36-1.42 (K=3), 1.38-1.84 (K=5), 1.42-1.77 (K=7),
1.59-1.86 (K=8); td/t1 = EAGLE-3 (1 layer) 0.35-0.64, P-EAGLE (2) 0.10-0.20,
DFlash (2-3) 0.18-0.21, DSpark (2-3) 0.17-0.43; full vocabulary: 1.1-2.4, 0.3-0.7,
0.3-0.4, 1.1-2.1.  tau needed for 1.5x at K=7: P-EAGLE 2.3-3.0, DFlash 2.45-2.9,
DSpark 2.4-3.3, EAGLE-3 2.7-3.6.  Two threads on the two shared cores: t1 1.1-1.5 s
(oversubscribed; unusable).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from draft_cost import propose_timer  # bench/ is on sys.path: this file runs as a script

from specui.algorithms import create_drafter
from specui.verifier.model import Verifier

ALGOS = ("eagle3", "peagle", "dflash", "dspark")


def verifier_costs(
    v: Verifier, context: int, ks: list[int], repeats: int, aux: list[int]
) -> tuple[float, dict[int, float]]:
    """Median seconds of a 1-token decode step and of verifying K+1 tokens (with aux taps)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, v.vocab_size, (context + max(ks) + 2,), generator=g)
    cache = v.new_cache()
    v.forward(ids[:context], cache, None, logits=False)  # prefill, not timed
    samples: dict[int, list[float]] = {0: [], **{k: [] for k in ks}}
    for _ in range(repeats + 2):  # two warm-up rounds
        for k in samples:
            block = ids[context : context + k + 1]
            t0 = time.perf_counter()
            v.forward(block, cache, aux if k else None)
            samples[k].append(time.perf_counter() - t0)
            v.crop(cache, context)
    med = {k: statistics.median(s[2:]) for k, s in samples.items()}
    return med.pop(0), med


def make_drafter(  # noqa: ANN201
    algo: str, v: Verifier, k: int, layers: int, vocab: int | None, markov_rank: int
):
    draft_vocab = (
        list(range(vocab)) if vocab else None
    )  # which ids are kept does not change the cost
    sizes = {
        "eagle3": dict(num_speculative_tokens=k),
        "peagle": dict(num_speculative_tokens=k),
        "dflash": dict(block_size=k + 1),  # slot 0 is the anchor: K+1 slots draft K
        "dspark": dict(block_size=k, markov_rank=markov_rank),  # every slot drafts
    }[algo]
    d = create_drafter(algo, v, seed=0, num_layers=layers, draft_vocab=draft_vocab, **sizes)
    assert d.num_speculative_tokens == k, (algo, d.num_speculative_tokens, k)
    return d


def draft_costs(
    drafters: dict[str, object], v: Verifier, context: int, repeats: int
) -> dict[str, float]:
    """Median seconds of ``propose`` per variant, steady state (see bench/draft_cost.py)."""
    timed = propose_timer(drafters, v, context, repeats + 4, first_id=100)

    def step(d, n: int) -> float:  # noqa: ANN001
        return timed(d, n)[0]

    samples: dict[str, list[float]] = {name: [] for name in drafters}
    for d in drafters.values():
        d.reset()
        step(d, context)  # prefill
    for r in range(repeats + 2):
        for name, d in drafters.items():
            samples[name].append(step(d, context + 1 + r))
    return {name: statistics.median(s[2:]) for name, s in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--context", type=int, default=256, help="cached tokens before the timed step")
    ap.add_argument("--ks", default="3,5,7,8")
    ap.add_argument(
        "--draft-k", type=int, default=7, help="K of the drafter-cost and tau-needed tables"
    )
    ap.add_argument("--vocabs", default="4096,8192,16384,full")
    ap.add_argument("--algorithms", default=",".join(ALGOS))
    ap.add_argument(
        "--layers", default="eagle3:1,peagle:2,dflash:2,dspark:2", help="algo:layers,..."
    )
    ap.add_argument("--markov-rank", type=int, default=256)
    ap.add_argument("--target", type=float, default=1.5, help="speedup the tau-needed table is for")
    ap.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="verifier precision (specui.verifier.batch_invariant)",
    )
    args = ap.parse_args()
    ks = [int(x) for x in args.ks.split(",")]
    vocabs = [None if x == "full" else int(x) for x in args.vocabs.split(",")]
    layers = {a: int(n) for a, n in (p.split(":") for p in args.layers.split(","))}
    algos = args.algorithms.split(",")
    dk = args.draft_k

    v = Verifier.load("embedded", precision=args.precision)
    aux = v.default_aux_layer_ids()
    print(
        f"verifier {v.name} ({v.precision}): {v.num_layers} layers, hidden {v.hidden_size}, "
        f"vocab {v.vocab_size}; context {args.context}; median of {args.repeats}; aux taps {aux}"
    )
    with torch.inference_mode():
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            t1, tv = verifier_costs(v, args.context, ks, args.repeats, aux)
            print(f"\n== torch threads {threads}")
            print(f"verifier: decode step t1 = {t1 * 1e3:.1f} ms")
            print(
                "  "
                + "  ".join(
                    f"verify K={k} ({k + 1} tok): {tv[k] * 1e3:.1f} ms = {tv[k] / t1:.2f} t1"
                    for k in ks
                )
            )
            if dk not in tv:
                t1b, extra = verifier_costs(v, args.context, [dk], args.repeats, aux)
                tv[dk] = extra[dk] * t1 / t1b
            vname = {None: "full"}
            print(f"drafter cost per block, K={dk} (ms; in units of t1 in brackets)")
            print(
                f"  {'algo':<7}{'layers':>7} "
                + " ".join(f"{'V=' + vname.get(x, str(x)):>16}" for x in vocabs)
            )
            td: dict[tuple[str, int | None], float] = {}
            for algo in algos:
                ds = {
                    str(x): make_drafter(algo, v, dk, layers[algo], x, args.markov_rank)
                    for x in vocabs
                }
                times = draft_costs(ds, v, args.context, args.repeats)
                for x in vocabs:
                    td[algo, x] = times[str(x)]
                cells = [f"{times[str(x)] * 1e3:>7.1f} ({times[str(x)] / t1:.2f})" for x in vocabs]
                print(f"  {algo:<7}{layers[algo]:>7} " + " ".join(f"{c:>16}" for c in cells))
            print(
                f"tau needed for {args.target}x at K={dk} (tau_max {dk + 1}) = "
                f"{args.target} * (tv + td) / t1"
            )
            print(
                f"  {'algo':<7} " + " ".join(f"{'V=' + vname.get(x, str(x)):>10}" for x in vocabs)
            )
            for algo in algos:
                print(
                    f"  {algo:<7} "
                    + " ".join(
                        f"{args.target * (tv[dk] + td[algo, x]) / t1:>10.2f}" for x in vocabs
                    )
                )
            print(
                f"tau needed for {args.target}x by K, with each drafter's smallest-vocab cost "
                f"(draft cost taken as K={dk}'s; "
                "parallel drafters' cost is flat in K, EAGLE-3's grows ~linearly)"
            )
            small = vocabs[0]
            print(f"  {'algo':<7} " + " ".join(f"{'K=' + str(k):>8}" for k in ks))
            for algo in algos:
                scale = (lambda k: k / dk) if algo == "eagle3" else (lambda k: 1.0)
                print(
                    f"  {algo:<7} "
                    + " ".join(
                        f"{args.target * (tv[k] + td[algo, small] * scale(k)) / t1:>8.2f}"
                        for k in ks
                    )
                )


if __name__ == "__main__":
    main()
