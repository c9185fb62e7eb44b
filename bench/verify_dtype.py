"""Verifier precisions on a CPU: cost and batch invariance (run by hand).

    .venv/bin/python bench/verify_dtype.py [--prompts 4] [--tokens 64] [--block 9] [--repeats 20]

For each way of running the embedded verifier (float32; the whole model in
bfloat16; ``precision="bf16"``, SpecUI's batch-invariant bf16 of
``specui.verifier.batch_invariant``):

1. cost: the median of a one-token decode step ``t1`` and of verifying a block of
   ``--block`` tokens ``tv`` after a cached context, taken in turns;
2. batch invariance: decode ``--tokens`` greedily one token at a time (plain
   decoding), then run the same tokens through the verifier in blocks of
   ``--block`` (a speculative step whose drafts were all right) and count the
   positions whose argmax differs from the plain token.  Every such flip is a
   place where greedy speculative output would differ from plain decoding.

Measured 2026-11-29 on the project's 2-core CPU (AVX-512 with BF16), one thread.
Quiet machine, medians of 40 interleaved calls: float32 t1 58 ms, 9-token verify
115 ms (2.0x); bfloat16 t1 58 ms, 9-token verify 67 ms (1.16x).  With two 1-thread
jobs beside it: float32 96 / 183 ms (1.91x), 0 of 256 argmax flips; bfloat16
143 / 157 ms (1.09x), 3 of 256 flips (per prompt 0 2 1 0): the bf16 kernels round
a row differently when other rows come with it, and greedy DFlash decoding in
bfloat16 diverged from plain bfloat16 decoding on 3 held-out prompts of the first 8.

Measured 2026-11-30 (``--prompts 8``, one thread, nothing else running):

    verifier           t1 ms   tv ms  tv/t1  argmax flips (block 9 vs plain)
    float32             65.1   132.7   2.04  0/512 positions (per prompt: 0 0 0 0 0 0 0 0)
    bfloat16            56.9    66.6   1.17  5/512 positions (per prompt: 0 2 1 0 1 0 1 0)
    bf16-invariant      49.1    59.0   1.20  0/512 positions (per prompt: 0 0 0 0 0 0 0 0)

float32 has no flips here but is not bit-exact either (a block's logits differ from
the one-token ones by up to 5e-5); bf16-invariant's rows are bit-identical (its
load-time check and ``tests/verifier/test_batch_invariant.py``), and its one-token step is
the fastest of the three because its weights are packed once for oneDNN.  That is
why ``auto`` verifies in bf16-invariant where the check passes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specui.data import load_prompts
from specui.verifier.model import Verifier

VARIANTS = {  # label -> Verifier.load arguments
    "float32": {"dtype": torch.float32},
    "bfloat16": {"dtype": torch.bfloat16},  # the whole model in bf16
    # specui.verifier.batch_invariant: what `auto` picks here
    "bf16-invariant": {"precision": "bf16"},
}


def costs(v: Verifier, block: int, repeats: int, context: int = 256) -> tuple[float, float]:
    ids = torch.randint(
        100, v.vocab_size, (context + block,), generator=torch.Generator().manual_seed(0)
    )
    cache = v.new_cache()
    v.forward(ids[:context], cache, logits=False)
    one, many = [], []
    for _ in range(repeats + 2):
        for n, out in ((1, one), (block, many)):
            t0 = time.perf_counter()
            v.forward(ids[context : context + n], cache)
            out.append(time.perf_counter() - t0)
            v.crop(cache, context)
    return statistics.median(one[2:]), statistics.median(many[2:])


def flips(v: Verifier, prompt_ids: list[int], tokens: int, block: int) -> tuple[int, int]:
    """(positions whose block-verified argmax differs from plain greedy decoding, positions)."""
    cache = v.new_cache()
    v.forward(torch.tensor(prompt_ids[:-1]), cache, logits=False)
    last, plain = prompt_ids[-1], []
    for _ in range(tokens):  # plain greedy decoding, one token per pass
        last = int(v.forward(torch.tensor([last]), cache).logits[-1].argmax())
        plain.append(last)
    cache = v.new_cache()
    v.forward(torch.tensor(prompt_ids[:-1]), cache, logits=False)
    seq = [prompt_ids[-1], *plain]
    differ = 0
    for start in range(0, tokens, block - 1):  # [last, d_1..d_{block-1}] with every draft right
        chunk = seq[start : start + block]
        argmax = v.forward(torch.tensor(chunk), cache).logits.argmax(-1).tolist()
        differ += sum(
            a != b for a, b in zip(argmax, plain[start : start + block - 1], strict=False)
        )
        v.crop(
            cache, len(prompt_ids) - 1 + start + block - 1
        )  # the next block opens with the last token
    return differ, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4, help="held-out gsm-symbolic prompts")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--block", type=int, default=9, help="tokens per verify pass (K+1)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    prompts = load_prompts("gsm-symbolic", "eval", limit=a.prompts)
    print(
        f"{'verifier':<16}{'t1 ms':>8}{'tv ms':>8}{'tv/t1':>7}  argmax flips (block {a.block} vs"
        " plain)"
    )
    with torch.inference_mode():
        for label, load in VARIANTS.items():
            v = Verifier.load("embedded", **load)
            t1, tv = costs(v, a.block, a.repeats)
            counts = [flips(v, p.encode(v), a.tokens, a.block) for p in prompts]
            bad, total = sum(c[0] for c in counts), sum(c[1] for c in counts)
            per_prompt = " ".join(str(c[0]) for c in counts)
            print(
                f"{label:<16}{t1 * 1e3:>8.1f}{tv * 1e3:>8.1f}{tv / t1:>7.2f}  "
                f"{bad}/{total} positions (per prompt: {per_prompt})",
                flush=True,
            )


if __name__ == "__main__":
    main()
