"""Throughput of the training pipeline, stage by stage, new path against old, in one run.

    PYTHONPATH=. .venv/bin/python bench/pipeline_throughput.py [--quick|--smoke] [--json]
        [--procs 2]

In this order:

1. ``peak``: the machine's bf16 matmul rate on a fixed shape, (2048x576)@(576x1536), the
   verifier's MLP shape at a training batch's row count (median of repeats);
2. ``generate``: the verifier's greedy responses to training prompts -- SpecUI's batched
   generator (``specui.data.generate``) against transformers ``generate`` in bf16, batch 64
   (the corpus generator before it); with ``--procs N`` also N processes, one per core;
3. ``extract``: hidden states and top-k targets -- the batched bf16 ``LocalExtractor``
   against the old one-sample-at-a-time float32 forward;
4. ``train:<algorithm>`` for every registered trainable algorithm: steps of the new math
   (bf16 autocast, attention within each document, stored targets, metrics on logging
   steps only) against the old code itself, run from git (``--old-ref``, the commit before
   the pipeline changes) in a subprocess on the same sample files.

Tokens are sequence tokens (prompt + response).  MFU is the model FLOPs the stage does
per second over the peak measured in the same run.  FLOPs are counted by formula: a
forward of the verifier is ``2 * non-embedding parameters`` per token plus attention and
the LM head where logits are computed; a training step's FLOPs are those of its matmuls,
as ``torch.utils.flop_counter`` counts them from their shapes (forward and backward).

Run it on a quiet machine, one thread per process (the default): pause other work
(SIGSTOP) while it runs.  ``--json`` prints one object:
``{"peak_tflops": x, "stages": [{"stage": "train:dflash", "tokens_per_s": n,
"old_tokens_per_s": o, "mfu": m}, ...]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OLD_REF = "7e3e94b"  # main before the pipeline changes (issue 30)
PEAK_SHAPE = (2048, 576, 1536)


def peak_tflops(repeats: int = 30) -> float:
    m, k, n = PEAK_SHAPE
    a = torch.randn(m, k).bfloat16()
    b = torch.randn(k, n).bfloat16()
    for _ in range(5):
        a @ b
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * m * k * n / statistics.median(times) / 1e12


def forward_flops(verifier, tokens: int, context: float, logits: int) -> float:
    """Model FLOPs of a verifier forward over ``tokens`` tokens at mean ``context`` keys,
    with the LM head on ``logits`` of them."""
    c = verifier.config
    params = sum(p.numel() for p in verifier.model.parameters())
    embed = c.vocab_size * c.hidden_size
    tied = getattr(c, "tie_word_embeddings", False)
    body = params - embed * (1 if tied else 2)
    attention = 4 * c.num_hidden_layers * c.hidden_size * context  # scores and values
    return 2 * body * tokens + attention * tokens + 2 * embed * logits


# --- stages --------------------------------------------------------------------------------


def samples_for(verifier, n: int, max_new_tokens: int):
    """``n`` training samples of the shipped general corpus (its responses, no generation)."""
    from specui.data.distill import self_distill
    from specui.data.prompts import load_prompts

    prompts = load_prompts("general", split="train", limit=n)
    return self_distill(verifier, prompts, max_new_tokens=max_new_tokens, cache_dir=None)


def stage_generate(verifier, samples, max_new_tokens: int, procs: int, peak: float) -> list[dict]:
    from specui.data.generate import measure_generation

    prompts = [list(s.prompt_ids) for s in samples]
    old = measure_generation(
        verifier, prompts, max_new_tokens, engine="transformers", batch_size=64
    )
    new = measure_generation(verifier, prompts, max_new_tokens, engine="fast", batch_size=64)
    ctx = statistics.mean(len(p) for p in prompts) + max_new_tokens / 2
    flops = forward_flops(
        verifier, new["prompt_tokens"] + new["response_tokens"], ctx, new["response_tokens"]
    )
    rows = [
        _row(
            "generate",
            new["tokens_per_s"],
            old["tokens_per_s"],
            flops / new["seconds"] / 1e12 / peak,
            response_tokens_per_s=new["response_tokens_per_s"],
            old_response_tokens_per_s=old["response_tokens_per_s"],
        )
    ]
    if procs > 1:
        one = generate_in_processes(samples, max_new_tokens, 1)
        many = generate_in_processes(samples, max_new_tokens, procs)
        rows.append(
            _row(
                f"generate:{procs}proc",
                many,
                one,
                None,
                note=f"{procs} processes against 1, same prompts, verifier loads included",
            )
        )
    return rows


def generate_in_processes(samples, max_new_tokens: int, procs: int) -> float:
    """Prompt + response tokens/s of ``distill_in_processes`` over a fresh cache."""
    from specui.data.distill import _read_cache, distill_in_processes
    from specui.data.prompts import Prompt

    prompts = [Prompt(s.id, "bench", token_ids=s.prompt_ids) for s in samples]
    with tempfile.TemporaryDirectory(prefix="specui-gen-") as cache:
        t = time.perf_counter()
        distill_in_processes(
            "embedded", prompts, procs, max_new_tokens, cache, generation_dtype=torch.bfloat16
        )
        seconds = time.perf_counter() - t
        made = {}
        for f in Path(cache).glob("responses-*.jsonl"):
            made.update(_read_cache(f))
    tokens = sum(len(s.prompt_ids) for s in samples) + sum(len(r) for r in made.values())
    return tokens / seconds


def old_extract(verifier, samples, layer_ids: list[int], out: Path) -> None:
    """The extraction before the pipeline change: float32, one sample per forward, taps only."""
    from specui.data.hidden import write_sample

    out.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(samples):
        ids = torch.tensor(s.input_ids, dtype=torch.long)
        taps = verifier.taps(ids, layer_ids)
        write_sample(
            out / f"{i}.safetensors", taps, ids, torch.tensor(s.loss_mask, dtype=torch.long)
        )


def stage_extract(verifier, samples, aux: list[int], work: Path, peak: float) -> tuple[dict, Path]:
    from specui.data.hidden import LocalExtractor

    ex = LocalExtractor(verifier, aux)
    ex.head()  # the bf16 LM head is cast once per run, outside the clock
    tokens = sum(len(s) for s in samples)
    t = time.perf_counter()
    old_extract(verifier, samples, ex.layer_ids, work / "old-hidden")
    old_s = time.perf_counter() - t
    t = time.perf_counter()
    ex.extract(samples, work / "hidden")
    new_s = time.perf_counter() - t
    ctx = statistics.mean(len(s) for s in samples) / 2
    mfu = forward_flops(verifier, tokens, ctx, tokens) / new_s / 1e12 / peak
    return _row("extract", tokens / new_s, tokens / old_s, mfu), work / "hidden"


def step_flops(objective, model, batch) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = objective.loss(model, batch, torch.Generator().manual_seed(0), metrics=False)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def new_train(
    verifier,
    algo: str,
    files: list[Path],
    kept: torch.Tensor,
    steps: int,
    batch_size: int,
    log_every: int = 10,
) -> tuple[float, float, float]:
    """(sequence tokens/s, FLOPs per token, median step s) of the new training math."""
    from specui.algorithms.objective import objective_for
    from specui.data.hidden import read_sample
    from specui.training.config import TrainConfig
    from specui.training.step import make_optimizer

    cfg = TrainConfig.from_dict(
        {"algorithm": algo, "draft_vocab_size": len(kept), "markov_rank": 256}
    )
    obj = objective_for(cfg, verifier)
    obj.draft_vocab = kept
    model = obj.build().train()
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], cfg)
    samples = [read_sample(f, len(model.config.aux_layer_ids)) for f in files]
    batches = [
        samples[i : i + batch_size] for i in range(0, len(samples) - batch_size + 1, batch_size)
    ]
    flops = step_flops(obj, model, batches[0]) / sum(len(s) for s in batches[0])
    gen = torch.Generator()
    times, tokens = [], []
    for step in range(steps + 1):
        batch = batches[step % len(batches)]
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = obj.loss(
                model, batch, gen.manual_seed(step), metrics=(step + 1) % log_every == 0
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step:  # the first step warms oneDNN's caches
            times.append(time.perf_counter() - t)
            tokens.append(sum(len(s) for s in batch))
    return sum(tokens) / sum(times), flops, statistics.median(times)


# The old code's step, run from a tree of OLD_REF: its objective recomputed the verifier's
# targets from the stored last layer in every step, attended across the packed batch, in
# float32, with metrics every step.  Its imports are OLD_REF's module layout (then
# specui/verifier.py was one module): they are pinned to that commit, never renamed with a move
# in the present tree, and old_tree checks the files are there (OLD_MODULES).
OLD_MODULES = (
    "specui/verifier.py",
    "specui/training/config.py",
    "specui/training/objectives.py",
    "specui/training/loop.py",
    "specui/data/hidden.py",
)
OLD_TRAIN = r"""
import json, statistics, sys, time, torch
torch.set_num_threads(1)
from specui.verifier import Verifier
from specui.training.config import TrainConfig
from specui.training.objectives import TargetHead, objective_for
from specui.training.loop import make_optimizer
from specui.data.hidden import read_sample
a = json.loads(sys.argv[1])
v = Verifier.load("embedded")
kept = torch.tensor(a["kept"])
cfg = TrainConfig(algorithm=a["algo"], prompts="gsm-symbolic", draft_vocab_size=len(kept),
                  markov_rank=256)
obj = objective_for(cfg, v, TargetHead(v, kept, torch.device("cpu")))
obj.draft_vocab = kept
model = obj.build().train()
opt = make_optimizer([p for p in model.parameters() if p.requires_grad], cfg)
samples = [read_sample(f, len(model.config.aux_layer_ids)) for f in a["files"]]
bs = a["batch_size"]
batches = [samples[i:i + bs] for i in range(0, len(samples) - bs + 1, bs)]
gen = torch.Generator()
times, tokens = [], []
for step in range(a["steps"] + 1):
    batch = batches[step % len(batches)]
    t = time.perf_counter()
    loss, _ = obj.loss(model, batch, gen.manual_seed(step))
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    if step:
        times.append(time.perf_counter() - t); tokens.append(sum(len(s) for s in batch))
print(json.dumps({"tokens_per_s": sum(tokens) / sum(times), "step_s": statistics.median(times)}))
"""


def old_tree(ref: str, dest: Path) -> Path:
    """The ``specui`` package of commit ``ref``, unpacked into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "specui"], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    missing = [m for m in OLD_MODULES if not (dest / m).is_file()]
    if missing:
        raise SystemExit(
            f"commit {ref} has no {', '.join(missing)}: the old training step imports"
            f" {OLD_REF}'s modules (OLD_TRAIN); give --old-ref a commit of that layout"
        )
    return dest


def old_train(
    tree: Path, algo: str, files: list[Path], kept: torch.Tensor, steps: int, batch_size: int
) -> dict:
    args = {
        "algo": algo,
        "files": [str(f) for f in files],
        "kept": kept.tolist(),
        "steps": steps,
        "batch_size": batch_size,
    }
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", OLD_TRAIN, json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        cwd=tree,
    )
    if out.returncode:
        raise RuntimeError(f"the old training step failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _row(stage: str, new: float, old: float | None, mfu: float | None, **more) -> dict:
    return {
        "stage": stage,
        "tokens_per_s": new,
        "old_tokens_per_s": old,
        "ratio": new / old if old else None,
        "mfu": mfu,
        **more,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes: under 5 minutes")
    p.add_argument(
        "--smoke", action="store_true", help="the smallest sizes: only checks that it runs"
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--procs", type=int, default=1, help="also time generation in N processes")
    p.add_argument("--old-ref", default=OLD_REF, help="the commit whose code is the old path")
    p.add_argument("--stages", default="generate,extract,train", help="comma-separated")
    p.add_argument(
        "--algorithms", default=None, help="comma-separated (default: every trainable one)"
    )
    a = p.parse_args()
    torch.set_num_threads(1)
    from specui.algorithms.objective import most_frequent_tokens
    from specui.algorithms.spec import algorithm_names
    from specui.verifier.model import Verifier

    n_gen, n_samples, steps, max_new = (
        (8, 8, 1, 16) if a.smoke else (32, 32, 3, 64) if a.quick else (128, 96, 10, 128)
    )
    batch_size = 4
    stages = set(a.stages.split(","))
    say = (lambda *x: print(*x, file=sys.stderr, flush=True)) if a.json else print

    peak = peak_tflops()
    say(f"peak bf16 matmul {PEAK_SHAPE}: {peak:.2f} TFLOPS")
    verifier = Verifier.load("embedded")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="specui-pipeline-") as tmp:
        work = Path(tmp)
        samples = samples_for(verifier, max(n_gen, n_samples), 128)
        if "generate" in stages:
            rows += stage_generate(verifier, samples[:n_gen], max_new, a.procs, peak)
            say(_fmt(rows[-1]))
        if "extract" in stages or "train" in stages:
            aux = verifier.default_aux_layer_ids()
            row, hidden = stage_extract(verifier, samples[:n_samples], aux, work, peak)
            if "extract" in stages:
                rows.append(row)
                say(_fmt(row))
        if "train" in stages:
            from specui.data.hidden import LocalExtractor

            ex = LocalExtractor(verifier, aux)
            files = [hidden / ex.file_name(s) for s in samples[:n_samples]]
            kept = most_frequent_tokens(samples, verifier.vocab_size, 8192)
            tree = old_tree(a.old_ref, work / "old")
            algos = a.algorithms.split(",") if a.algorithms else algorithm_names(trainable=True)
            for algo in algos:
                tps, fpt, step_s = new_train(verifier, algo, files, kept, steps, batch_size)
                old = old_train(tree, algo, files, kept, steps, batch_size)
                rows.append(
                    _row(
                        f"train:{algo}",
                        tps,
                        old["tokens_per_s"],
                        fpt * tps / 1e12 / peak,
                        step_s=step_s,
                        old_step_s=old["step_s"],
                    )
                )
                say(_fmt(rows[-1]))
    if a.json:
        print(json.dumps({"peak_tflops": peak, "stages": rows}))
    return 0


def _fmt(r: dict) -> str:
    ratio = f"{r['ratio']:.1f}x" if r.get("ratio") else "-"
    mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
    old = f"{r['old_tokens_per_s']:.0f}" if r.get("old_tokens_per_s") else "-"
    return (
        f"{r['stage']:<18} {r['tokens_per_s']:8.0f} tok/s  old {old:>6} tok/s  {ratio:>6}  "
        f"MFU {mfu}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
