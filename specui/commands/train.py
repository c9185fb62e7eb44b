"""``specui train``: train a drafter by self-distillation, with a progress bar.

    specui train --algorithm dflash --verifier embedded --prompts gsm-symbolic --out runs/dflash
    specui train ... --extractor vllm    # hidden states from a vLLM server (.venv-vllm)

Runs under ``torchrun --nproc-per-node N -m specui train ...`` too (DDP).
"""

from __future__ import annotations

import argparse
import sys

from specui.trace import SpecUIError


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a drafter (DFlash, DSpark, P-EAGLE, EAGLE-3) on the verifier's own outputs")
    # Not argparse choices: the config reports an unknown algorithm with the list, as the job API does.
    p.add_argument("--algorithm", required=True, help="dflash | dspark | peagle | eagle3")
    p.add_argument("--verifier", default="embedded", help="embedded | HF folder | .gguf file | hub id")
    p.add_argument("--prompts", default="gsm-symbolic", help="a prompt set (humaneval, gsm-symbolic, rg-math, demo), a JSONL file, or a mix a,b (alternating)")
    p.add_argument("--out", required=True, help="output folder (final drafter, checkpoints/, metrics.jsonl)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")

    o = p.add_argument_group("optimisation")
    o.add_argument("--steps", type=int, default=200)
    o.add_argument("--batch-size", type=int, default=4, help="sequences per step (per process)")
    o.add_argument("--lr", type=float, default=6e-4)
    o.add_argument("--min-lr-ratio", type=float, default=0.1)
    o.add_argument("--warmup-steps", type=int, default=20)
    o.add_argument("--schedule", default="cosine", help="cosine | linear | constant")
    o.add_argument("--weight-decay", type=float, default=0.01)
    o.add_argument("--grad-clip", type=float, default=1.0)
    o.add_argument("--seed", type=int, default=0)
    o.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    o.add_argument("--device", default="auto", help="auto | cpu | cuda")

    d = p.add_argument_group("data")
    d.add_argument("--num-prompts", type=int, default=None, help="use the first N training prompts")
    d.add_argument("--max-new-tokens", type=int, default=256, help="length of the self-distilled responses")
    d.add_argument("--gen-batch-size", type=int, default=8)
    d.add_argument("--max-seq-len", type=int, default=1024)
    d.add_argument("--extraction", default="mixed", help="hidden states: offline | online | mixed (with --extractor vllm, mixed runs as offline)")
    d.add_argument("--cache-dir", default=None, help="responses and hidden states (default OUT/cache)")
    d.add_argument("--extractor", default="local",
                   help="hidden states from the verifier in this process (local) or from a vLLM server the run "
                        "launches, extracting offline and stopping it before training (vllm); both fill the same cache")
    d.add_argument("--vllm-python", default=None, help="with --extractor vllm: vLLM's Python "
                   "(default $SPECUI_VLLM_PYTHON or .venv-vllm/bin/python)")
    d.add_argument("--vllm-gpu-memory-utilization", type=float, default=None,
                   help="with --extractor vllm on a GPU: vLLM's share of its memory (the trainer holds the verifier there too)")

    m = p.add_argument_group("drafter")
    m.add_argument("--layers", type=int, default=None, help="draft decoder layers (default: dflash/dspark/peagle 2, eagle3 1)")
    m.add_argument("--block-size", type=int, default=8, help="DFlash/DSpark block size B")
    m.add_argument("--max-anchors", type=int, default=64, help="DFlash/DSpark anchors per sequence")
    m.add_argument("--depths", dest="num_depths", type=int, default=4, help="P-EAGLE tokens per pass K")
    m.add_argument("--ttt-steps", type=int, default=3, help="EAGLE-3 training-time-test steps")
    m.add_argument("--aux-layers", dest="aux_layer_ids", type=_int_list, default=None, help="verifier layer ids, e.g. 2,15,27")
    m.add_argument("--draft-vocab-size", type=int, default=None, help="reduced draft vocabulary (most frequent tokens)")
    m.add_argument("--mask-token-id", type=int, default=None)
    m.add_argument("--markov-rank", type=int, default=256, help="DSpark Markov head rank")
    m.add_argument("--freeze-embeddings", action="store_true", help="P-EAGLE: keep the verifier's embedding (frozen, not stored)")
    m.add_argument("--init-from", default=None, help="warm start from a checkpoint (DSpark from DFlash)")

    loss = p.add_argument_group("loss")
    loss.add_argument("--gamma", type=float, default=4.0, help="DFlash/DSpark slot weight exp(-(k-1)/gamma)")
    loss.add_argument("--dpace", action="store_true", help="D-PACE adaptive slot weights instead")
    loss.add_argument("--tv-weight", type=float, default=0.0, help="DSpark: (1-w)*CE + w*TV")
    loss.add_argument("--confidence-weight", type=float, default=1.0, help="DSpark confidence-head BCE weight")
    loss.add_argument(
        "--confidence-temperature", type=float, default=1.0,
        help="DSpark: the head learns the acceptance chance at this sampling temperature (0: greedy)",
    )  # fmt: skip
    loss.add_argument("--cod-ratio", type=float, default=0.7, help="P-EAGLE sparsification r")
    loss.add_argument("--cod-min-ratio", type=float, default=0.2, help="P-EAGLE sparsification r_min")
    loss.add_argument("--loss", default=None, help="override the per-slot loss: ce | kl")

    b = p.add_argument_group("bookkeeping")
    b.add_argument("--log-every", type=int, default=10)
    b.add_argument("--checkpoint-every", type=int, default=50)
    b.add_argument("--keep-checkpoints", type=int, default=2)
    b.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    p.set_defaults(func=run)


CONFIG_KEYS = (
    "algorithm", "verifier", "prompts", "out", "resume", "steps", "batch_size", "lr", "min_lr_ratio",
    "warmup_steps", "schedule", "weight_decay", "grad_clip", "seed", "threads", "device", "num_prompts",
    "max_new_tokens", "gen_batch_size", "max_seq_len", "extraction", "cache_dir", "extractor", "vllm_python",
    "vllm_gpu_memory_utilization", "layers", "block_size",
    "max_anchors", "num_depths", "ttt_steps", "aux_layer_ids", "draft_vocab_size", "mask_token_id",
    "markov_rank", "init_from", "freeze_embeddings", "gamma", "dpace", "tv_weight", "confidence_weight",
    "confidence_temperature", "cod_ratio", "cod_min_ratio", "log_every", "checkpoint_every", "keep_checkpoints",
)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from specui.training.config import TrainConfig

    cfg = TrainConfig(**{k: getattr(args, k) for k in CONFIG_KEYS}, extra={"loss": args.loss} if args.loss else {})

    import os

    from tqdm import tqdm

    from specui.training.loop import TrainHooks, train

    main = int(os.environ.get("RANK", "0")) == 0
    bar = None  # made at the first step (after data preparation), starting at a resumed step

    def say(line: str) -> None:
        if not main:
            return
        if bar is not None:
            bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def progress(step: int, total: int, metrics: dict[str, float]) -> None:
        nonlocal bar
        if args.no_progress or not main:
            return
        if bar is None:
            bar = tqdm(total=total, initial=step, unit="step", dynamic_ncols=True, file=sys.stderr)
        bar.n = step
        if metrics:
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", tau=f"{metrics.get('accept_len', float('nan')):.2f}", refresh=False)
        bar.refresh()

    def stage(what: str, done: int, total: int) -> None:
        if done == total:
            say(f"{what}: {done}/{total}")

    try:
        result = train(cfg, TrainHooks(progress=progress, log=say, stage=stage))
    finally:
        if bar is not None:
            bar.close()
    if main:
        m = result.metrics
        summary = f"{result.status} at step {result.step}: {result.out}"
        if m:
            summary += f" (loss {m.get('loss', float('nan')):.4f}, accept_len {m.get('accept_len', float('nan')):.2f})"
        print(summary)
    if result.status == "cancelled":
        raise SpecUIError("training was cancelled")
    return 0
