"""Builds SpecUI's general-purpose training corpus for the embedded verifier, resumably.

    python scripts/build_corpus.py magpie --root ROOT [--samples N]
    python scripts/build_corpus.py prompts --root ROOT          # writes data/corpus/general.jsonl
    python scripts/build_corpus.py responses --root ROOT [--limit N]
    python scripts/build_corpus.py export --root ROOT          # data/corpus/responses-*.jsonl.gz

``magpie`` samples user turns from the verifier's own chat template (see
``specui.data.magpie``) into ROOT/magpie-raw.jsonl; ``prompts`` mixes the kept
turns with the templated tasks and the other sets' training splits into the
shipped prompt file; ``responses`` self-distils the verifier's greedy answers
into ROOT/cache (the cache ``specui train`` reads; ``--procs N`` shards the prompts over N
worker processes appending to the same cache); ``export`` ships those of the
corpus's training prompts as data/corpus/responses-*.jsonl.gz, which ``specui
train`` reads before its own cache, so nobody regenerates them.  Each stage appends batch by
batch: kill it at any time and run it again to continue.  One torch thread
unless THREADS says otherwise (two threads on this 2-core machine's shared cores
are slower than one).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _setup() -> None:
    import torch

    torch.set_num_threads(int(os.environ.get("THREADS", "1")))


def _bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="sample", dynamic_ncols=True, mininterval=5)


def magpie(a: argparse.Namespace) -> None:
    _setup()
    import torch

    from specui.data.magpie import filter_user_turns, sample_user_turns
    from specui.verifier.model import Verifier

    # bf16 generation: the turns are prompts, not training targets, so the fastest
    # precision this CPU has (AMX bf16 matmuls) is the right one.
    verifier = Verifier.load("embedded", dtype=torch.bfloat16)
    path = Path(a.root) / "magpie-raw.jsonl"
    bar = _bar(a.samples, "magpie")
    t0 = time.time()

    def progress(done: int, total: int) -> None:
        bar.n = done
        bar.refresh()

    rows = sample_user_turns(
        verifier,
        a.samples,
        path,
        batch_size=a.batch_size,
        max_new_tokens=a.max_new_tokens,
        progress=progress,
    )
    bar.close()
    kept = filter_user_turns(rows)
    print(
        f"magpie: {len(rows)} samples, {len(kept)} kept, {time.time() - t0:.0f} s this run",
        flush=True,
    )


def prompts(a: argparse.Namespace) -> None:
    import json

    from specui.data import corpus
    from specui.data.magpie import filter_user_turns, read_samples

    raw = Path(a.root) / "magpie-raw.jsonl"
    kept = filter_user_turns(read_samples(raw))
    sources = {
        "magpie": corpus.magpie_rows(kept),
        "text": corpus.text_tasks(seed=a.seed),
        "code": corpus.code_tasks(seed=a.seed),
        "reasoning": corpus.reasoning_tasks(),
        "gsm-symbolic": corpus.registered("gsm-symbolic", "math", 1000),
        "rg-math": corpus.registered("rg-math", "math", 1000),
        "humaneval": corpus.registered("humaneval", "code", 200),
    }
    for name, rows in sources.items():
        print(f"prompts: {name}: {len(rows)}", flush=True)
    rows = corpus.build(sources.values(), seed=a.seed)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    tmp.replace(out)
    print(f"prompts: {len(rows)} distinct prompts -> {out}", flush=True)


def responses(a: argparse.Namespace) -> None:
    _setup()
    import torch

    from specui.data import load_prompts
    from specui.data.distill import self_distill
    from specui.verifier.model import Verifier

    prompt_list = load_prompts(a.prompts, split="train", limit=a.limit)
    bar = _bar(len(prompt_list), "responses")
    t0 = time.time()

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.set_postfix_str(f"{time.time() - t0:.0f} s")
        bar.refresh()

    if a.procs > 1:  # workers fill the cache; this process then reads it back below
        from specui.data.distill import distill_in_processes

        distill_in_processes(
            "embedded",
            prompt_list,
            a.procs,
            a.max_new_tokens,
            Path(a.root) / "cache",
            a.batch_size,
            a.max_prompt_tokens,
            torch.bfloat16,
            progress,
            threads=int(os.environ.get("THREADS", "1")),
        )
        progress = None
    # float32: the cache is keyed by the verifier training loads
    verifier = Verifier.load("embedded")
    samples = self_distill(
        verifier,
        prompt_list,
        a.max_new_tokens,
        a.batch_size,
        Path(a.root) / "cache",
        max_prompt_tokens=a.max_prompt_tokens,
        progress=progress,
        generation_dtype=torch.bfloat16,
    )
    bar.close()
    tokens = sum(len(s.response_ids) for s in samples)
    print(
        f"responses: {len(samples)} samples, {tokens} response tokens, {time.time() - t0:.0f} s"
        " this run",
        flush=True,
    )


def export(a: argparse.Namespace) -> None:
    from specui.data import load_prompts
    from specui.data.distill import export_cache, prompt_key
    from specui.verifier.model import Verifier

    verifier = Verifier.load("embedded")
    keep = {prompt_key(p.encode(verifier)) for p in load_prompts(a.prompts, split="train")}
    for path in export_cache(Path(a.root) / "cache", REPO / "data" / "corpus", keep):
        print(f"export: {path} ({path.stat().st_size / 2**20:.1f} MiB)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="stage", required=True)
    m = sub.add_parser("magpie")
    m.add_argument("--root", required=True)
    m.add_argument("--samples", type=int, default=12000)
    m.add_argument("--batch-size", type=int, default=128)
    m.add_argument("--max-new-tokens", type=int, default=80)
    p = sub.add_parser("prompts")
    p.add_argument("--root", required=True)
    p.add_argument("--out", default=str(REPO / "data" / "corpus" / "general.jsonl"))
    p.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("responses")
    r.add_argument("--root", required=True)
    r.add_argument("--prompts", default="general")
    r.add_argument("--limit", type=int, default=None)
    r.add_argument("--max-new-tokens", type=int, default=128)
    r.add_argument("--max-prompt-tokens", type=int, default=None)
    r.add_argument("--batch-size", type=int, default=64)
    r.add_argument("--procs", type=int, default=1, help="worker processes (one torch thread each)")
    e = sub.add_parser("export")
    e.add_argument("--root", required=True)
    e.add_argument("--prompts", default="general")
    a = ap.parse_args()
    {"magpie": magpie, "prompts": prompts, "responses": responses, "export": export}[a.stage](a)


if __name__ == "__main__":
    main()
