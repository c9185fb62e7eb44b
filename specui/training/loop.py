"""The one training loop every algorithm shares.

    prompts -> self-distilled responses -> verifier hidden states -> batches
    -> objective.loss (the drafter's training-layout forward) -> AdamW step
    -> metrics every ``log_every`` steps, a checkpoint every ``checkpoint_every``

Hidden states come from the verifier in this process (``LocalExtractor``) or
from a vLLM server the run launches (``cfg.extractor == "vllm"``): that one
extracts everything first and stops before the first step (see
``hidden_state_store``).  Both write the same cache files, so either reuses
what the other extracted.

Compute runs under bf16 autocast where the CPU has fast bf16 matmuls (AMX or
AVX512-BF16; ``cfg.precision``), with float32 master weights, softmax and
losses.  The verifier runs once per sample, at extraction (hidden states and its
top-k targets, ``specui.data.hidden``); a training step reads them from disk and
runs no part of it.  Everything random is derived from (seed, step, rank) --
batch order, anchors, sparsified depths -- so a run resumed from a checkpoint
draws exactly what the uninterrupted run would have drawn.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from torch import nn

from specui.algorithms.layers import draft_target_ids
from specui.algorithms.objective import Objective, most_frequent_tokens, objective_for
from specui.atomic import write_json, write_text
from specui.data.distill import TokenSample, self_distill
from specui.data.hidden import (
    HiddenStateExtractor,
    HiddenStateStore,
    LocalExtractor,
    SampleTensors,
    fast_matmul_dtype,
)
from specui.data.prompts import load_prompts
from specui.errors import SpecUIError
from specui.training import distributed
from specui.training.config import TrainConfig
from specui.training.progress import generation_plan
from specui.training.state import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
RUN_FILE = "train_run.json"
VLLM_LOG = "vllm-extract.log"  # the vLLM extraction server's log, in the run's folder


@dataclass
class TrainHooks:
    """How a caller (CLI, job worker, test) watches and steers a run.  All optional."""

    progress: Callable[[int, int, dict[str, float]], None] | None = (
        None  # (step, total, last metrics)
    )
    log: Callable[[str], None] | None = None
    metric: Callable[[int, str, float], None] | None = None
    cancelled: Callable[[], bool] | None = None
    stage: Callable[[str, int, int], None] | None = None  # data preparation: (what, done, total)
    # Called with the step just before a checkpoint of it is written: a caller that buffers the
    # metrics (the job worker) commits them here, so a checkpoint on disk implies its curve is
    # stored.
    checkpoint: Callable[[int], None] | None = None

    def say(self, line: str) -> None:
        log.info(line)
        if self.log:
            self.log(line)


@dataclass
class TrainResult:
    out: Path
    step: int  # steps completed
    status: str  # "finished" | "cancelled"
    metrics: dict[str, float] = field(default_factory=dict)  # the last logged
    resumed_from: int | None = None
    model: nn.Module | None = field(
        default=None, repr=False
    )  # the trained drafter (this process's copy)


class StepModule(nn.Module):
    """drafter + objective as one module, so DDP sees every parameter the loss uses."""

    def __init__(self, model: nn.Module, objective: Objective) -> None:
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, batch: list[SampleTensors], gen: torch.Generator, metrics: bool = True):
        return self.objective.loss(self.model, batch, gen, metrics)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine or linear decay to ``lr * min_lr_ratio`` (or constant)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(1, cfg.steps - cfg.warmup_steps)
    frac = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    if cfg.schedule == "linear":
        return cfg.lr - (cfg.lr - floor) * frac
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * frac))


def step_seed(seed: int, step: int, rank: int) -> int:
    return (seed * 1_000_003 + step * 7919 + rank * 104_729) % (2**63 - 1)


def batch_indices(
    step: int, num_samples: int, batch_size: int, world: int, rank: int, seed: int
) -> list[int]:
    """This process's share of global batch ``step``: epochs of seeded permutations."""
    gb = batch_size * world
    perms: dict[int, torch.Tensor] = {}
    out = []
    for j in range(rank, gb, world):
        epoch, i = divmod(step * gb + j, num_samples)
        if epoch not in perms:
            perms[epoch] = torch.randperm(
                num_samples, generator=torch.Generator().manual_seed(seed + 7 * epoch)
            )
        out.append(int(perms[epoch][i]))
    return out


# --- data ------------------------------------------------------------------------------------


def prepare_samples(
    cfg: TrainConfig, verifier, cache_dir: Path, d: distributed.Dist, hooks: TrainHooks
) -> list[TokenSample]:
    """Train-split prompts -> self-distilled token samples, cut to ``max_seq_len``."""
    prompts = load_prompts(cfg.prompts, split="train", limit=cfg.num_prompts)
    if not prompts:
        raise SpecUIError(f"prompt set {cfg.prompts!r} has no training prompts")

    planned = False

    def progress(done: int, total: int) -> None:
        nonlocal planned
        if not d.is_main:
            return
        if not planned:  # the first report, before any generation: what it will cost
            planned = True
            hooks.say(generation_plan(len(prompts), total - done, cfg.max_new_tokens))
        if hooks.stage:
            hooks.stage("generating responses", done, total)

    # The first process generates (and caches); the others then read the cache.
    if d.is_main:
        hooks.say(
            f"self-distillation: {len(prompts)} prompts, up to {cfg.max_new_tokens} new tokens each"
        )
        # bf16 matmuls where they are fast (the shipped responses were generated so too); the
        # cache stays keyed by the verifier as loaded.
        samples = self_distill(
            verifier,
            prompts,
            cfg.max_new_tokens,
            cfg.gen_batch_size,
            cache_dir,
            progress=progress,
            generation_dtype=fast_matmul_dtype(),
        )
    d.barrier()
    if not d.is_main:
        samples = self_distill(verifier, prompts, cfg.max_new_tokens, cfg.gen_batch_size, cache_dir)
    cut = []
    for s in samples:
        if len(s) > cfg.max_seq_len:
            keep = max(0, cfg.max_seq_len - len(s.prompt_ids))
            s = TokenSample(s.id, s.prompt_ids[: cfg.max_seq_len], s.response_ids[:keep])
        cut.append(s)
    return cut


# --- the loop --------------------------------------------------------------------------------


def train(cfg: TrainConfig, hooks: TrainHooks | None = None) -> TrainResult:
    """Run (or resume) one training run; returns when done, cancelled or failed."""
    hooks = hooks or TrainHooks()
    d = distributed.setup(cfg.device)
    out = Path(cfg.out).expanduser()
    created = not out.exists()
    try:
        # ``cleanup`` stops what the run started (a vLLM extraction server) however it ends:
        # finished, failed, cancelled (the job runner's SIGTERM becomes an exception), Ctrl-C.
        with contextlib.ExitStack() as cleanup:
            return _train(cfg, hooks, d, cleanup)
    except BaseException:
        if created and d.is_main:
            _remove_empty_folders(out)  # a failed start leaves no --out behind
        raise
    finally:
        distributed.teardown(d)


def _check_creatable(out: Path) -> None:
    """Refuse an --out that cannot be created, without creating it: the folder appears
    with the first file written into it, so a run that fails before that leaves none."""
    p = out
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        raise SpecUIError(f"cannot create the output folder {out}: {p} is not a folder")
    if p == out:
        return
    if not os.access(p, os.W_OK | os.X_OK):
        raise SpecUIError(f"cannot create the output folder {out}: {p} is not writable")


def _remove_empty_folders(out: Path) -> None:
    """Remove ``out`` and the empty folders under it; anything written is kept
    (self-distilled responses and hidden states are hours of work a retry reuses)."""
    if not out.is_dir():
        return
    for folder, _, _ in sorted(os.walk(out), key=lambda w: -len(w[0])):
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # only empty ones: rmdir refuses the rest


def _trim_metrics(path: Path, step: int) -> None:
    """A resumed run's metrics file ends at its checkpoint: the lines a killed run logged
    after it (the resumed run logs those steps again) and a torn last line are dropped,
    in one atomic rewrite."""
    if not path.is_file():
        return
    text = path.read_text()
    kept = []
    for line in text.splitlines(keepends=True):
        try:
            whole = line.endswith("\n") and json.loads(line)["step"] <= step
        except (json.JSONDecodeError, KeyError, TypeError):
            whole = False
        if whole:
            kept.append(line)
    if "".join(kept) != text:
        write_text(path, "".join(kept))


def _train(
    cfg: TrainConfig, hooks: TrainHooks, d: distributed.Dist, cleanup: contextlib.ExitStack
) -> TrainResult:
    from specui.verifier.model import Verifier

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out).expanduser()
    ckpt = latest_checkpoint(out)
    if ckpt is not None and not cfg.resume:
        raise SpecUIError(
            f"{out} already holds training checkpoints (step {ckpt.step}); pass --resume to"
            " continue, or choose another --out"
        )
    if d.is_main:
        _check_creatable(out)
    cache_dir = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else out / "cache"

    hooks.say(f"loading verifier {cfg.verifier}")
    verifier = Verifier.load(cfg.verifier)
    verifier.model.to(d.device)
    for p in verifier.model.parameters():
        p.requires_grad_(False)
    if cfg.extractor == "vllm":
        check_vllm_extraction(cfg, d)  # before the self-distillation, which may take hours

    samples = prepare_samples(cfg, verifier, cache_dir, d, hooks)
    kept = None
    if cfg.draft_vocab_size is not None and cfg.draft_vocab_size < verifier.vocab_size:
        kept = (
            inherited_draft_vocab(Path(cfg.init_from), cfg.draft_vocab_size)
            if cfg.init_from
            else None
        )
        if kept is not None:
            hooks.say(
                f"draft vocabulary of {cfg.draft_vocab_size} tokens kept from {cfg.init_from}"
            )
        else:
            kept = most_frequent_tokens(samples, verifier.vocab_size, cfg.draft_vocab_size)
    objective = objective_for(cfg, verifier)
    objective.draft_vocab = kept
    usable = [s for s in samples if objective.usable(s)]
    if not usable:
        raise SpecUIError(
            f"none of the {len(samples)} samples has a response long enough to train"
            f" {cfg.algorithm} on; raise --max-new-tokens (or --max-seq-len), or lower --block-size"
        )
    if len(usable) < len(samples):
        hooks.say(f"{len(samples) - len(usable)} samples with too short a response skipped")
    samples = usable

    model = objective.build().to(d.device)
    if cfg.init_from:
        warm_start(model, Path(cfg.init_from), verifier, hooks)
    d2t = getattr(model, "d2t", None)
    if kept is not None and d2t is not None and not torch.equal(draft_target_ids(d2t).cpu(), kept):
        # The loss would score the head's rows against other tokens than they draft.
        raise SpecUIError(f"the draft vocabulary of {cfg.init_from} does not match this run's")
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(trainable, cfg)
    n_params = sum(p.numel() for p in trainable)
    hooks.say(
        f"{cfg.algorithm} drafter: {cfg.num_layers} layers, {n_params / 1e6:.2f} M trainable"
        f" parameters, {len(samples)} samples"
    )

    start, resumed_from = 0, None
    if ckpt is not None:
        state = load_checkpoint(ckpt, model, optimizer)
        start = resumed_from = int(state["step"])
        hooks.say(f"resuming from {ckpt.path} (step {start})")
    if start >= cfg.steps:
        hooks.say(f"already trained {start} steps (asked for {cfg.steps})")

    store = hidden_state_store(
        cfg,
        verifier,
        model.config.aux_layer_ids,
        samples,
        cache_dir / "hidden",
        out,
        d,
        hooks,
        cleanup,
        prepare=start < cfg.steps,
    )

    step_module = StepModule(model, objective)
    runner: nn.Module = step_module
    if d.enabled:
        from torch.nn.parallel import DistributedDataParallel as DDP

        # Some heads (e.g. a confidence head with no valid slot in a batch) may get no gradient.
        runner = DDP(
            step_module,
            device_ids=[d.device.index] if d.device.type == "cuda" else None,
            find_unused_parameters=True,
        )

    metrics_path = out / METRICS_FILE
    if d.is_main:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SpecUIError(f"cannot create the output folder {out}: {e.strerror or e}") from None
        write_json(
            out / RUN_FILE, {"config": cfg.to_dict(), "world_size": d.world, "status": "running"}
        )
        if resumed_from is not None:
            _trim_metrics(metrics_path, resumed_from)
    last: dict[str, float] = {}
    window: list[dict[str, torch.Tensor]] = []
    shown: dict[str, torch.Tensor] = {}  # metrics of the logging step (computed on those only)
    dtype = compute_dtype(cfg, d.device)
    autocast = torch.autocast(d.device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)
    hooks.say(
        "compute: "
        + (
            "bf16 autocast, float32 master weights and losses"
            if dtype == torch.bfloat16
            else "float32"
        )
    )
    t_window, tokens_window = time.perf_counter(), 0
    status = "finished"

    def checkpoint(at: int) -> Path:
        if hooks.checkpoint:
            hooks.checkpoint(at)
        return save_checkpoint(
            out, at, model, optimizer, {"algorithm": cfg.algorithm}, cfg.keep_checkpoints
        )

    step = start
    gen = torch.Generator(device="cpu")
    if hooks.progress and d.is_main:
        hooks.progress(step, cfg.steps, last)
    while step < cfg.steps:
        if hooks.cancelled is not None and d.any(d.is_main and hooks.cancelled()):
            status = "cancelled"
            break
        lr = lr_at(step, cfg)
        for g in optimizer.param_groups:
            g["lr"] = lr
        idx = batch_indices(step, len(samples), cfg.batch_size, d.world, d.rank, cfg.seed)
        batch = [_to(s, d.device) for s in store.get(idx)]
        gen.manual_seed(step_seed(cfg.seed, step, d.rank))
        logging = (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps
        with autocast:
            loss, metrics = runner(batch, gen, logging)
        if not torch.isfinite(loss):
            raise SpecUIError(f"the loss became {loss.item()} at step {step}; lower --lr")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip)
        optimizer.step()
        step += 1

        tokens_window += sum(len(s) for s in batch)
        window.append({"loss": loss.detach(), "grad_norm": grad_norm.detach()})
        shown.update({k: v.detach() for k, v in metrics.items()})  # the logging step's only
        if logging:
            elapsed = time.perf_counter() - t_window
            last = summarize(window, d)
            last.update(summarize([shown], d) if shown else {})
            shown = {}
            last.update(
                lr=lr,
                step_time_s=elapsed / len(window),
                tokens_per_s=tokens_window * d.world / max(elapsed, 1e-9),
            )
            window, t_window, tokens_window = [], time.perf_counter(), 0
            if d.is_main:
                with metrics_path.open("a") as f:
                    f.write(json.dumps({"step": step, **strict(last)}) + "\n")
                if hooks.metric:
                    for k, v in last.items():
                        hooks.metric(step, k, v)
                hooks.say(
                    f"step {step}/{cfg.steps} loss {last['loss']:.4f} accept_len"
                    f" {last.get('accept_len', float('nan')):.2f} lr {lr:.2e}"
                )
        if d.is_main and hooks.progress:
            hooks.progress(step, cfg.steps, last)
        if step % cfg.checkpoint_every == 0 and step < cfg.steps and d.is_main:
            path = checkpoint(step)
            hooks.say(f"checkpoint {path}")

    if d.is_main:
        have = list_checkpoints(out)
        if step > 0 and (not have or have[-1].step != step):
            checkpoint(step)
        if status == "finished" and step >= cfg.steps:
            from specui.algorithms.checkpoint import save_drafter

            try:
                save_drafter(model, out)
            except (OSError, SafetensorError) as e:
                reason = getattr(e, "strerror", None) or e
                raise SpecUIError(
                    f"could not save the final drafter in {out}: {reason} (the last checkpoint is"
                    " kept)"
                ) from None
            hooks.say(f"saved drafter to {out}")
        run = json.loads((out / RUN_FILE).read_text())
        run.update(status=status, step=step, metrics=strict(last))
        write_json(out / RUN_FILE, run)
    d.barrier()
    return TrainResult(
        out=out,
        step=step,
        status=status,
        metrics=last,
        resumed_from=resumed_from,
        model=model.eval(),
    )


def make_extractor(
    cfg: TrainConfig, verifier, aux_layer_ids: list[int], out: Path, hooks: TrainHooks
) -> HiddenStateExtractor:
    """The extractor ``cfg.extractor`` names.  A vLLM one starts its server on first use
    (never, when the cache is already full) and must be closed."""
    if cfg.extractor == "local":
        return LocalExtractor(verifier, aux_layer_ids, batch_tokens=cfg.extract_batch_tokens)
    from specui.vllm.extract import VLLMExtractor
    from specui.vllm.server import ServerConfig, VLLMServer, is_cpu_build, vllm_python

    # Samples are cut to max_seq_len tokens and each request adds one output token: a
    # context that short lets vLLM reserve far less KV cache than the model's full one.
    max_len = cfg.max_seq_len + 1
    server = ServerConfig(
        python=cfg.vllm_python,
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        max_model_len=max_len if max_len <= verifier.max_context else None,
        log_path=str(out / VLLM_LOG),
    )
    # Requests in flight: vLLM batches them.  Four keep vLLM-CPU's one or few cores busy;
    # a GPU takes many more at once.
    concurrency = 4 if is_cpu_build(vllm_python(cfg.vllm_python)) else 32

    def launched(s: VLLMServer) -> None:
        hooks.say(
            f"vLLM extraction server on {s.base_url} (pid {s.server_pid}), ready after"
            f" {s.ready_after_s or 0:.0f} s; log {s.log_path}"
        )

    return VLLMExtractor.from_verifier(
        cfg.verifier,
        verifier,
        aux_layer_ids,
        server_config=server,
        concurrency=concurrency,
        on_launch=launched,
    )


def check_vllm_extraction(cfg: TrainConfig, d: distributed.Dist) -> None:
    """Refuse a vLLM extraction that cannot work, before any data is prepared."""
    from specui.vllm.server import check_installed, resolve_model, vllm_python

    if cfg.extraction == "online" and d.enabled:
        # Every process would launch a server of its own (on the same GPU, or the same cores).
        raise SpecUIError(
            "online extraction with the vLLM extractor runs in one process only; "
            "use --extraction offline (the default for vLLM) under torchrun"
        )
    resolve_model(cfg.verifier)  # vLLM serves Hugging Face folders and hub ids, not .gguf files
    check_installed(vllm_python(cfg.vllm_python))


def hidden_state_store(
    cfg: TrainConfig,
    verifier,
    aux_layer_ids: list[int],
    samples: list[TokenSample],
    cache_dir: Path,
    out: Path,
    d: distributed.Dist,
    hooks: TrainHooks,
    cleanup: contextlib.ExitStack,
    *,
    prepare: bool = True,
) -> HiddenStateStore:
    """The trainer's source of hidden states; offline mode extracts everything now (``prepare``).

    With vLLM, mixed extraction runs as offline: a vLLM server holds its model and KV
    cache (on a GPU, a fixed share of its memory; on a CPU, cores spinning) for as long
    as it runs, so it extracts every missing sample first and stops before the first
    training step, instead of idling through training to serve the first epoch's misses.
    The cache ends up the same as mixed mode's.  Only an explicit ``online`` (nothing
    kept on disk) keeps it running through training.
    """
    extractor = make_extractor(cfg, verifier, aux_layer_ids, out, hooks)
    close = getattr(extractor, "close", None)
    if close is not None:
        cleanup.callback(close)
    mode = cfg.extraction
    if cfg.extractor == "vllm":
        if mode == "mixed":
            mode = "offline"
        hooks.say(
            "hidden states from vLLM: "
            + (
                "online, the server runs through training"
                if mode == "online"
                else "extracted first, the server stops before training"
            )
        )
    # The extractor brings the verifier's head: files written without targets get them from it.
    store = HiddenStateStore(extractor, samples, mode, cache_dir)
    if mode != "offline" or not prepare:
        return store
    # The local verifier runs in every process: each extracts its share.  One vLLM
    # server does all of it, from the first process; the others wait at the barrier.
    if cfg.extractor == "vllm":
        mine = range(len(samples)) if d.is_main else range(0)
        chunk = 4 * getattr(extractor, "concurrency", 1)  # requests vLLM can batch
    else:
        # Enough samples per call for the local extractor's length batches to fill.
        mine, chunk = range(d.rank, len(samples), d.world), 64
    need = store.check_disk(mine, verifier.hidden_size)
    missing = len(store.missing(mine))
    hooks.say(
        f"extracting hidden states of {missing} of {len(samples)} samples "
        f"(offline, {cfg.extractor}): {need / 2**30:.2f} GiB in {cache_dir}"
    )

    def progress(done: int, total: int) -> None:
        if hooks.stage and d.is_main:
            hooks.stage("extracting hidden states", done, total)

    store.prepare(mine, progress=progress, chunk=chunk)
    if close is not None:
        close()  # the server's memory goes back before the drafter trains
    d.barrier()
    return store


def compute_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype:
    """The matmul dtype of training steps: bf16 where asked, or under ``auto`` where the
    device multiplies bf16 fast (a GPU; a CPU with AMX or AVX512-BF16, where it is 5-10x
    float32's rate; elsewhere bf16 on a CPU is slower than float32)."""
    if cfg.precision == "fp32":
        return torch.float32
    if cfg.precision == "bf16" or device.type == "cuda":
        return torch.bfloat16
    return fast_matmul_dtype()


def make_optimizer(params: list[nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    # No weight decay on norm gains and biases (1-D), as is usual for transformers.
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))


def summarize(window: list[dict[str, torch.Tensor]], d: distributed.Dist) -> dict[str, float]:
    """Mean of each metric over the window's steps and over processes (NaN = absent)."""
    names = sorted(window[0])
    local = torch.stack(
        [torch.stack([w[k].float().cpu() for w in window]).nanmean() for k in names]
    )
    return {k: float(v) for k, v in zip(names, d.mean(local).tolist(), strict=True)}


def strict(metrics: dict[str, float]) -> dict[str, float | None]:
    """NaN (an empty metric, e.g. no complete block) as null: files stay strict JSON."""
    return {k: None if math.isnan(v) else v for k, v in metrics.items()}


def _to(s: SampleTensors, device: torch.device) -> SampleTensors:
    if device.type == "cpu":
        return s
    return SampleTensors(
        *(
            t.to(device, non_blocking=True)
            for t in (s.input_ids, s.hidden_states, s.target_ids, s.target_logprobs, s.loss_mask)
        )
    )


def inherited_draft_vocab(path: Path, size: int) -> torch.Tensor | None:
    """The target ids of a warm-start checkpoint's draft vocabulary, if it has one of ``size``.

    Its ``d2t`` and draft head rows are copied by ``warm_start``; a vocabulary
    recounted from other training data would put other tokens behind those rows.
    """
    from safetensors import safe_open

    from specui.algorithms.checkpoint import WEIGHTS_FILE

    file = path / WEIGHTS_FILE
    try:
        with safe_open(str(file), "pt") as f:
            if "d2t" not in set(f.keys()):
                return None
            d2t = f.get_tensor("d2t").long()
    except (OSError, SafetensorError) as e:
        raise SpecUIError(f"cannot read the warm-start checkpoint {file}: {e}") from None
    return draft_target_ids(d2t) if d2t.numel() == size else None


_VOCAB_MAPS = ("d2t", "t2d")  # the run's own draft vocabulary, set by build(); never copied


def _remapped_vocab_rows(
    src: dict[str, torch.Tensor], own: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Draft-vocabulary rows of ``src`` moved to where the same tokens sit in ``own``.

    A warm start onto another draft vocabulary (general data after math) would
    otherwise re-initialise the whole draft head; the tokens both vocabularies
    hold keep what they learned, the others keep their fresh init.  The maps
    themselves (``d2t``, ``t2d``) stay the run's own.
    """
    if "d2t" not in src or "d2t" not in own:
        return {}
    if torch.equal(src["d2t"], own["d2t"]):
        return {k: v for k, v in src.items() if k in _VOCAB_MAPS and k in own}
    old_ids, new_ids = draft_target_ids(src["d2t"].long()), draft_target_ids(own["d2t"].long())
    old_slot = {int(t): i for i, t in enumerate(old_ids.tolist())}
    pairs = [(j, old_slot[int(t)]) for j, t in enumerate(new_ids.tolist()) if int(t) in old_slot]
    if not pairs:
        return {}
    new_rows, old_rows = (torch.tensor(c) for c in zip(*pairs, strict=True))
    out = {}
    for k, v in src.items():
        mine = own.get(k)
        if k in _VOCAB_MAPS or mine is None or v.dim() == 0 or mine.shape == v.shape:
            continue
        if (
            v.shape[0] == old_ids.numel()
            and mine.shape[0] == new_ids.numel()
            and v.shape[1:] == mine.shape[1:]
        ):
            w = mine.clone()
            w[new_rows] = v[old_rows].to(w.dtype)
            out[k] = w
    return out


def warm_start(model: nn.Module, path: Path, verifier, hooks: TrainHooks) -> None:
    """Copy every tensor of checkpoint ``path`` whose name and shape fit (DSpark from DFlash)."""
    from specui.algorithms.checkpoint import load_model

    src = load_model(path, verifier).state_dict()
    own = model.state_dict()
    taken = {
        k: v
        for k, v in src.items()
        if k in own and own[k].shape == v.shape and k not in _VOCAB_MAPS
    }
    taken.update(_remapped_vocab_rows(src, own))
    if not taken:
        raise SpecUIError(f"nothing in {path} fits this drafter (different verifier or shape)")
    model.load_state_dict(taken, strict=False)
    fresh = sorted(set(own) - set(taken) - set(_VOCAB_MAPS))
    hooks.say(
        f"warm start from {path}: {len(taken)} tensors copied"
        + (f", new: {', '.join(fresh)}" if fresh else "")
    )
