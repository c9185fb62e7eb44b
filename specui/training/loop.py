"""The one training loop every algorithm shares, over named stages:

    data        prompts -> self-distilled responses -> token samples   (training.data)
    targets     the verifier's hidden states and top-k targets          (training.targets)
    model       objective, drafter, draft vocabulary, warm start        (training.model)
    step        AdamW on objective.loss, its schedule and precision     (training.step)
    evaluation  metrics every ``log_every`` steps                        (training.evaluation)
                and on held-out samples every ``eval_every``              (training.heldout)
    checkpoint  the run's folder, checkpoints, the final drafter        (training.checkpoint)

The verifier runs once per sample, at extraction; a training step reads its hidden states
and targets from disk and runs no part of it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from specui.errors import SpecUIError
from specui.training import checkpoint as output
from specui.training import distributed
from specui.training import model as drafter
from specui.training.config import TrainConfig
from specui.training.data import prepare_samples
from specui.training.evaluation import MetricsLog
from specui.training.heldout import HeldOut
from specui.training.hooks import TrainHooks, TrainResult
from specui.training.state import latest_checkpoint, load_checkpoint
from specui.training.step import Stepper
from specui.training.targets import check_vllm_extraction, hidden_state_store
from specui.verifier.model import Verifier


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
            output.remove_empty_folders(out)  # a failed start leaves no --out behind
        raise
    finally:
        distributed.teardown(d)


def _load_verifier(cfg: TrainConfig, d: distributed.Dist, hooks: TrainHooks) -> Verifier:
    hooks.say(f"loading verifier {cfg.verifier}")
    verifier = Verifier.load(cfg.verifier)
    verifier.model.to(d.device)
    for p in verifier.model.parameters():
        p.requires_grad_(False)
    return verifier


def _train(
    cfg: TrainConfig, hooks: TrainHooks, d: distributed.Dist, cleanup: contextlib.ExitStack
) -> TrainResult:
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
        output.check_creatable(out)
    cache_dir = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else out / "cache"
    verifier = _load_verifier(cfg, d, hooks)
    if cfg.extractor == "vllm":
        check_vllm_extraction(cfg, d)  # before the self-distillation, which may take hours

    # data, model
    samples = prepare_samples(cfg, verifier, cache_dir, d, hooks)
    objective, model, samples = drafter.build(cfg, verifier, samples, d.device, hooks)
    stepper = Stepper(cfg, model, objective, d)
    n_params = sum(p.numel() for p in stepper.trainable)
    hooks.say(
        f"{cfg.algorithm} drafter: {cfg.num_layers} layers, {n_params / 1e6:.2f} M trainable"
        f" parameters, {len(samples)} samples"
    )
    start, resumed_from = 0, None
    if ckpt is not None:
        state = load_checkpoint(ckpt, model, stepper.optimizer)
        start = resumed_from = int(state["step"])
        hooks.say(f"resuming from {ckpt.path} (step {start})")
    if start >= cfg.steps:
        hooks.say(f"already trained {start} steps (asked for {cfg.steps})")

    # targets
    aux = model.config.aux_layer_ids
    store = hidden_state_store(
        cfg, verifier, aux, samples, cache_dir / "hidden", out, d, hooks, cleanup,
        prepare=start < cfg.steps,
    )  # fmt: skip
    stepper.start()
    if d.is_main:
        output.open_run(out, cfg, d.world, resumed_from)
    hooks.say(stepper.describe())

    # steps, evaluation, checkpoints
    metrics = MetricsLog(out, cfg.steps, d, hooks)
    heldout = (
        HeldOut(cfg, verifier, objective, aux, cache_dir)
        if cfg.eval_every and d.is_main and start < cfg.steps
        else None
    )
    status, step = "finished", start
    if hooks.progress and d.is_main:
        hooks.progress(step, cfg.steps, metrics.last)
    while step < cfg.steps:
        if hooks.cancelled is not None and d.any(d.is_main and hooks.cancelled()):
            status = "cancelled"
            break
        last = step + 1 == cfg.steps
        evaluating = cfg.eval_every > 0 and ((step + 1) % cfg.eval_every == 0 or last)
        logging = (step + 1) % cfg.log_every == 0 or last or evaluating
        lr, batch, loss, grad_norm, step_metrics = stepper.step(step, store, logging)
        step += 1
        metrics.add(batch, loss, grad_norm, step_metrics)
        if evaluating and heldout is not None:
            metrics.heldout = heldout.evaluate(model)
        if logging:
            metrics.log(step, lr)
        if d.is_main and hooks.progress:
            hooks.progress(step, cfg.steps, metrics.last)
        if step % cfg.checkpoint_every == 0 and step < cfg.steps and d.is_main:
            path = output.checkpoint(out, step, model, stepper.optimizer, cfg, hooks)
            hooks.say(f"checkpoint {path}")
        if cfg.snapshot_steps and step in cfg.snapshot_steps and d.is_main:
            hooks.say(f"snapshot {output.snapshot(out, step, model)}")

    if d.is_main:
        output.close_run(out, step, status, model, stepper.optimizer, cfg, hooks, metrics.last)
    d.barrier()
    return TrainResult(
        out=out,
        step=step,
        status=status,
        metrics=metrics.last,
        resumed_from=resumed_from,
        model=model.eval(),
    )
