"""llama.cpp for bench/engine_peer.py: runs in .venv-llamacpp (scripts/setup_llamacpp.sh).

    .venv-llamacpp/bin/python bench/llamacpp_worker.py GGUF --threads 1 --modes
    plain,ngram-simple,draft

Standard library and ``xllamacpp`` only, so SpecUI's venv carries no llama.cpp.  One
``xllamacpp.Server`` per mode, each holding the model; then one JSON request per line on
stdin, one JSON answer per line on stdout:

- ``{"op": "generate", "mode": M, "prompt": [ids], "max_tokens": N}`` -> the tokens and
  llama.cpp's own timings (prompt and generation ms, drafted / accepted counts);
- ``{"op": "step", "context": [ids], "block": [ids], "other": [ids]}`` -> the time llama.cpp
  takes to run ``block`` after a cached ``context``: the request alternates with
  ``context + other[:1]`` so the cache never already holds the block's first token.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import xllamacpp as xl

SPECULATION = {  # mode -> llama.cpp speculative type (None: plain decoding)
    "plain": None,
    "ngram-simple": "COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE",
    "ngram-map-k": "COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K",
    "ngram-cache": "COMMON_SPECULATIVE_TYPE_NGRAM_CACHE",
    # A draft model: --draft-gguf, by default the verifier's own file.  SmolLM2-135M is the
    # smallest model of its vocabulary (the draft must share it), so it is the smallest draft
    # llama.cpp accepts for this verifier; greedy, it drafts what the verifier would emit.
    "draft": "COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE",
}


def server(
    gguf: str, threads: int, mode: str, ctx: int, draft: str | None = None, draft_max: int = 8
) -> xl.Server:
    p = xl.CommonParams()
    p.model.path = gguf
    p.n_ctx = ctx
    p.n_parallel = 1
    p.cpuparams.n_threads = threads
    p.cpuparams_batch.n_threads = threads
    p.warmup = True
    kind = SPECULATION[mode]
    if kind is not None:
        p.speculative.types = [getattr(xl.common_speculative_type, kind)]
    if mode == "draft":
        d = p.speculative.draft
        d.mparams.path = draft or gguf
        d.n_max, d.n_min = draft_max, 0
        d.cpuparams.n_threads = threads
        d.cpuparams_batch.n_threads = threads
    return xl.Server(p)


def complete(srv: xl.Server, prompt: list[int], max_tokens: int, cache: bool) -> dict:
    req = {
        "prompt": prompt,
        "n_predict": max_tokens,
        "temperature": 0.0,
        "top_k": 1,
        "seed": 0,
        "cache_prompt": cache,
        "return_tokens": True,
    }
    t0 = time.perf_counter()
    out = srv.handle_completions(req)
    wall = time.perf_counter() - t0
    if "error" in out:
        raise RuntimeError(out["error"])
    timings = out.get("timings", {})
    return {
        "tokens": out.get("tokens") or out["choices"][0].get("tokens"),
        "text": out["choices"][0]["text"],
        "wall_s": wall,
        **timings,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--modes", default="plain,ngram-simple")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument(
        "--draft-gguf", default=None, help="the draft mode's model (default: GGUF itself)"
    )
    ap.add_argument(
        "--draft-max", type=int, default=8, help="the draft mode's most drafted tokens a step"
    )
    a = ap.parse_args()
    servers = {
        m: server(a.gguf, a.threads, m, a.ctx, a.draft_gguf, a.draft_max)
        for m in a.modes.split(",")
    }
    info = {"ready": True, "modes": list(servers), "system": xl.get_system_info().strip()}
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "generate":
            ans = complete(servers[req["mode"]], req["prompt"], req["max_tokens"], cache=False)
        elif req["op"] == "step":
            srv = servers["plain"]
            complete(
                srv, req["context"] + req["other"][:1], 1, cache=True
            )  # cache: context + other
            ans = complete(srv, req["context"] + req["block"], 1, cache=True)  # runs just the block
        else:
            raise ValueError(f"unknown op {req['op']!r}")
        print(json.dumps(ans), flush=True)


if __name__ == "__main__":
    main()
