"""The data stage: train-split prompts -> the verifier's self-distilled token samples, and
which of them each step's batch holds."""

from __future__ import annotations

from pathlib import Path

import torch

from specui.data.distill import TokenSample, self_distill
from specui.data.hidden import SampleTensors, fast_matmul_dtype
from specui.data.prompts import load_prompts
from specui.errors import SpecUIError
from specui.training import distributed
from specui.training.config import TrainConfig
from specui.training.hooks import TrainHooks
from specui.training.progress import generation_plan


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
        samples = responses(cfg, verifier, prompts, cache_dir, progress)
    d.barrier()
    if not d.is_main:
        samples = self_distill(verifier, prompts, cfg.max_new_tokens, cfg.gen_batch_size, cache_dir)
    return cut_samples(samples, cfg.max_seq_len)


def responses(
    cfg: TrainConfig, verifier, prompts, cache_dir: Path, progress=None
) -> list[TokenSample]:
    """The verifier's responses to ``prompts`` as this run generates them (and caches)."""
    # bf16 matmuls where they are fast (the shipped responses were generated so too); the
    # cache stays keyed by the verifier as loaded.
    return self_distill(
        verifier,
        prompts,
        cfg.max_new_tokens,
        cfg.gen_batch_size,
        cache_dir,
        progress=progress,
        generation_dtype=fast_matmul_dtype(),
    )


def cut_samples(samples: list[TokenSample], max_seq_len: int) -> list[TokenSample]:
    """Samples longer than ``max_seq_len`` cut to it (the prompt's start kept)."""
    cut = []
    for s in samples:
        if len(s) > max_seq_len:
            keep = max(0, max_seq_len - len(s.prompt_ids))
            s = TokenSample(s.id, s.prompt_ids[:max_seq_len], s.response_ids[:keep])
        cut.append(s)
    return cut


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


def to_device(s: SampleTensors, device: torch.device) -> SampleTensors:
    """A sample's tensors on ``device`` (the sample itself on the CPU)."""
    if device.type == "cpu":
        return s
    return SampleTensors(
        *(
            t.to(device, non_blocking=True)
            for t in (s.input_ids, s.hidden_states, s.target_ids, s.target_logprobs, s.loss_mask)
        )
    )
