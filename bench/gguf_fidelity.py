"""How close each verifier precision stays to the float32 verifier (run by hand).

    PYTHONPATH=. .venv/bin/python bench/gguf_fidelity.py [--prompts 12] [--max-new-tokens 128]
                                       [--precisions bf16,gguf,gguf-q8,int8] [--llamacpp]

The embedded verifier in float32 (the GGUF file dequantized, ``fp32``) is the reference.  For the
first ``--prompts`` Spec-Bench questions (chat template, greedy), per precision: on how many
prompts the greedy output equals fp32's token for token, the mean share of output positions
before the first difference, and, over every prompt's prefill logits, the largest
``|logit - fp32 logit|`` relative to the largest fp32 logit and the share of positions whose
argmax agrees.  Issue 23's bar for ``gguf``: its greedy outputs equal fp32's on at least as many
prompts as bf16's do.  ``--llamacpp`` adds llama.cpp on the same GGUF file (through
``bench/llamacpp_worker.py`` in .venv-llamacpp, ``scripts/setup_llamacpp.sh``; greedy outputs only,
it reports no prefill logits): it computes as ``gguf-q8`` does (rows made int8 per block of 32), so
its agreement is the bar ``auto`` holds ``gguf-q8`` to.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from specui.algorithms.simple import PlainDrafter
from specui.data import load_prompts
from specui.engine import generate
from specui.verifier.model import Verifier


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--precisions", default="bf16,gguf,gguf-q8,int8")
    ap.add_argument("--llamacpp", action="store_true", help="also llama.cpp's greedy outputs")
    a = ap.parse_args()
    torch.set_num_threads(1)
    ref = Verifier.load("embedded", precision="fp32")
    prompts = [p.encode(ref) for p in load_prompts("spec-bench", limit=a.prompts)]
    want = [
        generate(ref, PlainDrafter(), ids, max_new_tokens=a.max_new_tokens).output_token_ids
        for ids in prompts
    ]
    want_logits = [ref.forward(torch.tensor(ids), ref.new_cache()).logits for ids in prompts]
    print(f"{len(prompts)} Spec-Bench prompts, {a.max_new_tokens} new tokens, greedy, against fp32")
    print(
        f"{'precision':>9}  {'outputs = fp32':>14}  {'agreeing prefix':>15} "
        f" {'max |dlogit| / max':>18}  {'argmax agrees':>13}"
    )
    for precision in a.precisions.split(","):
        v = Verifier.load("embedded", precision=precision)
        equal, prefix, worst, agree = 0, [], 0.0, []
        for ids, out, logits in zip(prompts, want, want_logits, strict=True):
            got = generate(v, PlainDrafter(), ids, max_new_tokens=a.max_new_tokens).output_token_ids
            equal += got == out
            prefix.append(_agreeing(got, out))
            mine = v.forward(torch.tensor(ids), v.new_cache()).logits
            worst = max(worst, ((mine - logits).abs().max() / logits.abs().max()).item())
            agree.append((mine.argmax(-1) == logits.argmax(-1)).float().mean().item())
        print(
            f"{v.precision:>9}  {equal:>9}/{len(prompts):<4}  {statistics.mean(prefix):>15.1%} "
            f" {worst:>18.1e}  {statistics.mean(agree):>13.2%}"
        )
    if a.llamacpp:
        from engine_peer import ROOT, LlamaCpp  # bench/ is this script's folder

        from specui.verifier.embedded import embedded_gguf_path

        llama = LlamaCpp(
            ROOT / ".venv-llamacpp" / "bin" / "python", embedded_gguf_path(), 1, ["plain"]
        )
        outs = [
            llama.ask(op="generate", mode="plain", prompt=ids, max_tokens=a.max_new_tokens)
            for ids in prompts
        ]
        llama.close()
        # llama.cpp returns its text (this build no token ids): both sides are compared as that
        # text tokenized again, without the end-of-turn token SpecUI keeps.
        eos = set(ref.eos_token_ids)

        def retokenized(text: str) -> list[int]:
            return ref.tokenizer.encode(text, add_special_tokens=False)

        outs = [retokenized(o["text"]) for o in outs]
        want = [retokenized(ref.tokenizer.decode([t for t in w if t not in eos])) for w in want]
        equal = sum(got == out for got, out in zip(outs, want, strict=True))
        prefix = [_agreeing(got, out) for got, out in zip(outs, want, strict=True)]
        print(f"{'llama.cpp':>9}  {equal:>9}/{len(prompts):<4}  {statistics.mean(prefix):>15.1%}")


def _agreeing(got: list[int], out: list[int]) -> float:
    """The share of ``out`` before ``got`` first differs from it."""
    same = next(
        (i for i, (x, y) in enumerate(zip(got, out, strict=False)) if x != y),
        min(len(got), len(out)),
    )
    return same / max(len(out), 1)


if __name__ == "__main__":
    main()
