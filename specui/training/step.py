"""The step stage: one optimizer step of the drafter on a batch, and its schedule.

Compute runs under bf16 autocast where the device has fast bf16 matmuls (AMX or
AVX512-BF16, a GPU; ``cfg.matmul_precision``), with float32 master weights, softmax and losses.
Everything random is derived from (seed, step, rank) -- batch order, anchors, sparsified
depths -- so a run resumed from a checkpoint draws exactly what the uninterrupted run would
have drawn.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from specui.algorithms.objective import Objective
from specui.data.hidden import HiddenStateStore, SampleTensors, fast_matmul_dtype
from specui.errors import SpecUIError
from specui.training import distributed
from specui.training.config import TrainConfig
from specui.training.data import batch_indices, to_device


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


def compute_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype:
    """The matmul dtype of training steps: bf16 where asked, or under ``auto`` where the
    device multiplies bf16 fast (a GPU; a CPU with AMX or AVX512-BF16, where it is 5-10x
    float32's rate; elsewhere bf16 on a CPU is slower than float32)."""
    if cfg.matmul_precision == "fp32":
        return torch.float32
    if cfg.matmul_precision == "bf16" or device.type == "cuda":
        return torch.bfloat16
    return fast_matmul_dtype()


def make_optimizer(params: list[nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    # No weight decay on norm gains and biases (1-D), as is usual for transformers.
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))


class Stepper:
    """The optimizer and what each step needs: ``step(n, logging)`` trains on batch ``n``."""

    def __init__(
        self,
        cfg: TrainConfig,
        model: nn.Module,
        objective: Objective,
        d: distributed.Dist,
    ) -> None:
        self.cfg, self.d = cfg, d
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.trainable, cfg)
        self.step_module = StepModule(model, objective)
        self.runner: nn.Module | None = None
        self.dtype = compute_dtype(cfg, d.device)
        self.autocast = torch.autocast(
            d.device.type, dtype=torch.bfloat16, enabled=self.dtype == torch.bfloat16
        )
        self.gen = torch.Generator(device="cpu")

    def start(self) -> None:
        """Ready to step: under torchrun, wrapped in DDP (after a resume loaded the weights:
        DDP broadcasts the first process's at construction)."""
        self.runner = self.step_module
        if self.d.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            # Some heads (e.g. a confidence head with no valid slot in a batch) may get no
            # gradient.
            self.runner = DDP(
                self.step_module,
                device_ids=[self.d.device.index] if self.d.device.type == "cuda" else None,
                find_unused_parameters=True,
            )

    def describe(self) -> str:
        if self.dtype == torch.bfloat16:
            return "compute: bf16 autocast, float32 master weights and losses"
        return "compute: float32"

    def step(self, step: int, store: HiddenStateStore, logging: bool):
        """Train on global batch ``step``: (lr, the batch, loss, grad norm, the step's metrics
        (computed only when ``logging``))."""
        cfg, d = self.cfg, self.d
        lr = lr_at(step, cfg)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        idx = batch_indices(step, len(store.samples), cfg.batch_size, d.world, d.rank, cfg.seed)
        batch = [to_device(s, d.device) for s in store.get(idx)]
        self.gen.manual_seed(step_seed(cfg.seed, step, d.rank))
        with self.autocast:
            loss, metrics = self.runner(batch, self.gen, logging)
        if not torch.isfinite(loss):
            raise SpecUIError(f"the loss became {loss.item()} at step {step}; lower --lr")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, cfg.grad_clip)
        self.optimizer.step()
        return lr, batch, loss, grad_norm, metrics
