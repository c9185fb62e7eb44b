"""Drafting time per block vs K for EAGLE-3 and the parallel drafters (run by hand, not in CI).

    .venv/bin/python bench/draft_cost.py [--embedded] [--repeats 15] [--context 128]
                                         [--markov-rank 256]

Randomly initialised drafters at the sizes of the embedded verifier
(SmolLM2-135M: hidden 576, 30 layers, vocab 49152, 9 heads / 3 kv heads,
head_dim 64).  The verifier is a random LlamaForCausalLM of those sizes (no
download) unless ``--embedded`` loads the real one; only its embedding, LM
head and widths matter here.  Each timed call is one decoding step in steady
state: one more committed token (and its verifier features) than the last
call, so the drafters' incremental caches do what they do in the engine.
One CPU thread (two-thread timings swing on these machines); median of repeats.

``--share PRECISION`` instead loads the embedded verifier in that precision (e.g. ``gguf``) with
each shipped drafter of ``--algorithms`` as the engine resolves it, decodes ``--prompts``
Spec-Bench questions greedily, and reports per algorithm the draft time as a share of the verify
time (sums over every step of every prompt, the engine's own per-step timers; and "steady", without
each prompt's first step, whose draft includes the drafter's pass over the prompt), the mean draft
and verify ms a step, the mean first draft, and tau.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specui.algorithms import create_drafter
from specui.algorithms.base import DraftContext
from specui.trace import SamplingParams
from specui.verifier.model import Verifier

KS = (2, 4, 8, 16)
# Issue 32's bars for --share: a parallel drafter's draft costs at most 10% of a verify, EAGLE-3's
# (K sequential steps) at most 25%.
PARALLEL_BAR = 0.10
SHARE_BARS = {"eagle3": 0.25}


def smollm2_sized_verifier() -> Verifier:
    from transformers import LlamaConfig, LlamaForCausalLM

    widths = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536}
    heads = {"num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64}
    rest = {"max_position_embeddings": 8192, "rope_theta": 100000.0, "tie_word_embeddings": True}
    cfg = LlamaConfig(
        **widths, num_hidden_layers=30, **heads, **rest, bos_token_id=1, eos_token_id=2
    )
    torch.manual_seed(0)
    return Verifier(LlamaForCausalLM(cfg).eval(), None, name="random-smollm2-sized")


def drafter_for(algo: str, verifier: Verifier, k: int, markov_rank: int = 256):  # noqa: ANN201
    sizes = {
        "eagle3": dict(num_layers=1, num_speculative_tokens=k),
        "peagle": dict(num_layers=2, num_speculative_tokens=k),
        "dflash": dict(num_layers=2, block_size=k + 1),  # slot 0 is the anchor: K+1 slots draft K
        "dspark": dict(num_layers=2, block_size=k, markov_rank=markov_rank),  # every slot drafts
    }[algo]
    d = create_drafter(algo, verifier, seed=0, **sizes)
    assert d.num_speculative_tokens == k
    return d


def propose_timer(
    drafters: dict, verifier: Verifier, context: int, steps: int, *, first_id: int = 0
):  # noqa: ANN201
    """``step(drafter, n)``: one timed ``propose`` at context length ``n`` (up to ``context +
    steps``), on random token ids (from ``first_id``) and taps made once, seeded, for every
    drafter alike; it returns (seconds, the proposal)."""
    g = torch.Generator().manual_seed(1)
    total = context + steps
    ids = torch.randint(first_id, verifier.vocab_size, (total,), generator=g)
    width = len(next(iter(drafters.values())).aux_layer_ids) * verifier.hidden_size
    feats = torch.randn(total, width, generator=g)
    sampling = SamplingParams()

    def step(drafter, n: int):  # noqa: ANN001, ANN202
        ctx = DraftContext(
            token_ids=ids[:n], features=feats[: n - 1], sampling=sampling, generator=None
        )
        t0 = time.perf_counter()
        proposal = drafter.propose(ctx)
        return time.perf_counter() - t0, proposal

    return step


def time_blocks(
    drafters: dict[int, object], verifier: Verifier, context: int, repeats: int
) -> dict[int, float]:
    """Median seconds of ``propose`` per K over ``repeats`` consecutive decoding steps.

    The Ks take turns step by step, so a burst of load from another process
    hits them alike instead of skewing one K's numbers.
    """
    timed = propose_timer(drafters, verifier, context, repeats + 1)

    def step(drafter, n: int) -> float:  # noqa: ANN001
        dt, proposal = timed(drafter, n)
        assert len(proposal) == drafter.num_speculative_tokens
        return dt

    samples: dict[int, list[float]] = {k: [] for k in drafters}
    for d in drafters.values():
        d.reset()
        step(d, context)  # prefill: the caches take the whole prompt once (not timed)
    for r in range(repeats):
        for k, d in drafters.items():
            samples[k].append(step(d, context + 1 + r))
    return {k: statistics.median(v) for k, v in samples.items()}


def draft_share(precision: str, algorithms: list[str], prompts: int, max_new_tokens: int) -> None:
    """Per shipped drafter: sum of draft time over sum of verify time, from real greedy decodes."""
    from specui.algorithms.resolve import resolve_drafter
    from specui.data import load_prompts
    from specui.engine import generate

    verifier = Verifier.load("embedded", precision=precision)
    ids = [p.encode(verifier) for p in load_prompts("spec-bench", limit=prompts)]
    print(
        f"verifier {verifier.name} in {verifier.precision}; {len(ids)} Spec-Bench prompts,"
        f" {max_new_tokens} new tokens, greedy, one thread"
    )
    # A generation's first draft also runs the drafter over the whole prompt, while the verifier's
    # prompt pass is timed apart (prefill): "steady" leaves that first step out, and "prompt ms"
    # is the mean first draft.
    header = f"{'drafter':<8} {'draft / verify':>14} {'steady':>7} {'draft ms/step':>13}"
    print(f"{header} {'verify ms/step':>14} {'prompt ms':>9} {'tau':>5}  bar")
    for algo in algorithms:
        drafter = resolve_drafter(algo, verifier)
        runs = [
            generate(verifier, drafter, prompt, max_new_tokens=max_new_tokens).steps
            for prompt in ids
        ]
        steps = [s for run in runs for s in run]
        later = [s for run in runs for s in run[1:]]
        draft, verify = sum(s.draft_time_s for s in steps), sum(s.verify_time_s for s in steps)
        steady = sum(s.draft_time_s for s in later) / sum(s.verify_time_s for s in later)
        prompt_ms = statistics.mean(run[0].draft_time_s for run in runs) * 1e3
        tau = statistics.mean(s.num_accepted + 1 for s in steps)
        share, bar = draft / verify, SHARE_BARS.get(algo, PARALLEL_BAR)
        per_step = f"{draft / len(steps) * 1e3:>13.1f} {verify / len(steps) * 1e3:>14.1f}"
        verdict = "met" if share <= bar else f"missed by {share - bar:.1%}"
        print(
            f"{algo:<8} {share:>14.1%} {steady:>7.1%} {per_step} {prompt_ms:>9.1f} {tau:>5.2f}"
            f"  <= {bar:.0%}: {verdict}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--embedded", action="store_true", help="load the real embedded SmolLM2 verifier"
    )
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--context", type=int, default=128, help="prompt length before the timed steps")
    ap.add_argument("--algorithms", default="eagle3,peagle,dflash,dspark")
    ap.add_argument(
        "--markov-rank", type=int, default=256, help="DSpark Markov head rank (0 = none)"
    )
    ap.add_argument(
        "--share", metavar="PRECISION", help="draft time / verify time of the shipped drafters"
    )
    ap.add_argument("--prompts", type=int, default=4, help="Spec-Bench questions for --share")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="tokens a prompt for --share")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.share:
        draft_share(args.share, args.algorithms.split(","), args.prompts, args.max_new_tokens)
        return

    verifier = Verifier.load("embedded") if args.embedded else smollm2_sized_verifier()
    print(
        f"verifier {verifier.name}: hidden {verifier.hidden_size}, {verifier.num_layers} layers,"
        f" vocab {verifier.vocab_size}; torch threads {torch.get_num_threads()};"
        f" context {args.context}; median of {args.repeats}"
    )
    k_columns = " ".join(f"{f'K={k} ms':>9}" for k in KS)
    ratio_columns = " ".join(f"{f't{k}/t2':>6}" for k in KS[1:])
    print(f"{'drafter':<8} {'layers':>6} {k_columns}  {ratio_columns}")
    with torch.inference_mode():
        for algo in args.algorithms.split(","):
            drafters = {k: drafter_for(algo, verifier, k, args.markov_rank) for k in KS}
            times = time_blocks(drafters, verifier, args.context, args.repeats)
            layers = drafters[KS[0]].model.config.layer.num_hidden_layers
            ms = " ".join(f"{times[k] * 1e3:>9.2f}" for k in KS)
            ratios = " ".join(f"{times[k] / times[2]:>6.2f}" for k in KS[1:])
            print(f"{algo:<8} {layers:>6} {ms}  {ratios}")


if __name__ == "__main__":
    main()
