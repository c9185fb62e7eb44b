"""The targets stage: where a run's hidden states and the verifier's top-k targets come from.

The verifier in this process (``LocalExtractor``) or a vLLM server the run launches
(``cfg.extractor == "vllm"``, through ``specui.training.vllm_extraction``): that one
extracts everything first and stops before the first step.  Both write the same cache files,
so either reuses what the other extracted.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from specui.data.distill import TokenSample
from specui.data.hidden import HiddenStateExtractor, HiddenStateStore, LocalExtractor
from specui.errors import SpecUIError
from specui.training import distributed, vllm_extraction
from specui.training.config import TrainConfig
from specui.training.hooks import TrainHooks

VLLM_LOG = "vllm-extract.log"  # the vLLM extraction server's log, in the run's folder


def make_extractor(
    cfg: TrainConfig, verifier, aux_layer_ids: list[int], out: Path, hooks: TrainHooks
) -> HiddenStateExtractor:
    """The extractor ``cfg.extractor`` names.  A vLLM one starts its server on first use
    (never, when the cache is already full) and must be closed."""
    if cfg.extractor == "local":
        return LocalExtractor(
            verifier,
            aux_layer_ids,
            batch_tokens=cfg.extract_batch_tokens,
            store=cfg.hidden_store,
        )
    # Samples are cut to max_seq_len tokens and each request adds one output token: a
    # context that short lets vLLM reserve far less KV cache than the model's full one.
    max_len = cfg.max_seq_len + 1
    return vllm_extraction.extractor(
        cfg.verifier,
        verifier,
        aux_layer_ids,
        python=cfg.vllm_python,
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        max_model_len=max_len if max_len <= verifier.max_context else None,
        log_path=out / VLLM_LOG,
        on_launch=hooks.say,
    )


def check_vllm_extraction(cfg: TrainConfig, d: distributed.Dist) -> None:
    """Refuse a vLLM extraction that cannot work, before any data is prepared."""
    if cfg.extraction == "online" and d.enabled:
        # Every process would launch a server of its own (on the same GPU, or the same cores).
        raise SpecUIError(
            "online extraction with the vLLM extractor runs in one process only; "
            "use --extraction offline (the default for vLLM) under torchrun"
        )
    vllm_extraction.check_extraction(cfg.verifier, cfg.vllm_python)


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
