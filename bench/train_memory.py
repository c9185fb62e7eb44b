"""Peak memory of one DFlash training step: random anchors vs every position an anchor.

DFlash trains on ``--max-anchors`` random blocks per sequence instead of a block
at every position; this measures what that saves, on the same batch, in one
run.  Each configuration runs one forward + backward of the real training
objective (``specui.algorithms.dflash``); between runs memory is handed back to
the OS and the peak counter is reset, so each figure is that step's own peak:

* CPU: peak resident memory (``VmHWM``, reset through ``/proc/self/clear_refs``)
  minus the resident memory just before the step;
* CUDA: ``torch.cuda.max_memory_allocated`` minus the allocation before the step.

    .venv/bin/python bench/train_memory.py                   # SmolLM2, 2 gsm-symbolic samples
    .venv/bin/python bench/train_memory.py --draft-vocab-size 4096 --anchors 32,64,128
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specui.algorithms.dflash.objective import select_anchors  # noqa: E402
from specui.algorithms.dflash.options import DFlashOptions  # noqa: E402
from specui.algorithms.objective import objective_for  # noqa: E402
from specui.algorithms.objective import pack as pack_batch  # noqa: E402
from specui.data.distill import self_distill  # noqa: E402
from specui.data.hidden import HiddenStateStore, LocalExtractor  # noqa: E402
from specui.data.prompts import load_prompts  # noqa: E402
from specui.training.config import TrainConfig  # noqa: E402
from specui.verifier.embedded import cache_dir  # noqa: E402
from specui.verifier.model import Verifier  # noqa: E402


def _status(field: str) -> int:
    return (
        int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))
        * 1024
    )


def reset_peak(device: torch.device) -> int:
    """Free what can be freed, reset the peak counter; return the memory in use now."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    return _status("VmRSS")


def peak(device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return _status("VmHWM")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--verifier", default="embedded")
    ap.add_argument("--prompts", default="gsm-symbolic")
    ap.add_argument("--num-prompts", type=int, default=2, help="sequences in the batch")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument(
        "--anchors", default="64", help="comma-separated max-anchors values to compare with 'all'"
    )
    ap.add_argument("--draft-vocab-size", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    verifier = Verifier.load(args.verifier)
    verifier.model.to(device)
    prompts = load_prompts(args.prompts, "train", limit=args.num_prompts)
    samples = self_distill(verifier, prompts, args.max_new_tokens, cache_dir=cache_dir() / "bench")
    cfg = TrainConfig(
        algorithm="dflash",
        verifier=args.verifier,
        layers=args.layers,
        draft_vocab_size=args.draft_vocab_size,
        options=DFlashOptions(block_size=args.block_size),
    )
    kept = None
    if args.draft_vocab_size:
        from specui.algorithms.objective import most_frequent_tokens

        kept = most_frequent_tokens(samples, verifier.vocab_size, args.draft_vocab_size)
    objective = objective_for(cfg, verifier)
    objective.draft_vocab = kept
    objective.draft_vocab = kept
    model = objective.build().to(device).train()
    store = HiddenStateStore(
        LocalExtractor(verifier, model.config.aux_layer_ids), samples, "online", "/nonexistent"
    )
    batch = [s for s in store.get(range(len(samples)))]
    if device.type == "cuda":
        fields = ("input_ids", "hidden_states", "target_ids", "target_logprobs", "loss_mask")
        batch = [type(s)(*(getattr(s, f).to(device) for f in fields)) for s in batch]
    tokens = sum(len(s) for s in batch)
    all_anchors = len(select_anchors(pack_batch(batch), args.block_size, 10**9, torch.Generator()))

    results = []
    settings = [int(a) for a in args.anchors.split(",")] + [10**9]
    for max_anchors in settings:
        objective.cfg.options.max_anchors = max_anchors
        model.zero_grad(set_to_none=True)
        before = reset_peak(device)
        t0 = time.perf_counter()
        loss, metrics = objective.loss(model, batch, torch.Generator().manual_seed(0))
        loss.backward()
        seconds = time.perf_counter() - t0
        step_peak = peak(device) - before
        anchors = int(metrics["anchors"])
        results.append(
            {
                "max_anchors": "all" if max_anchors == 10**9 else max_anchors,
                "anchors": anchors,
                "peak_bytes": step_peak,
                "seconds": seconds,
            }
        )
        del loss, metrics
        model.zero_grad(set_to_none=True)

    full = results[-1]["peak_bytes"]
    report = {
        "verifier": verifier.name,
        "device": str(device),
        "tokens": tokens,
        "sequences": len(batch),
        "block_size": args.block_size,
        "layers": args.layers,
        "draft_vocab_size": args.draft_vocab_size or verifier.vocab_size,
        "all_positions": all_anchors,
        "runs": [{**r, "ratio_to_all": r["peak_bytes"] / full} for r in results],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"DFlash training step, {verifier.name}, {device}: {len(batch)} sequences, {tokens} tokens,"
        f" B={args.block_size}, {args.layers} layers, draft vocab {report['draft_vocab_size']}"
    )
    print(f"{'max_anchors':>12} {'anchors':>8} {'peak MiB':>10} {'vs all':>8} {'step s':>8}")
    for r in report["runs"]:
        print(
            f"{r['max_anchors']!s:>12} {r['anchors']:>8} {r['peak_bytes'] / 2**20:>10.1f}"
            f" {r['ratio_to_all']:>8.3f} {r['seconds']:>8.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
