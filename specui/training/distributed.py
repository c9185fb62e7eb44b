"""One process or many: the trainer runs the same under ``torchrun``.

``torchrun --nproc-per-node N -m specui train ...`` sets RANK / WORLD_SIZE /
LOCAL_RANK; each process then holds a full copy of the verifier and drafter,
trains on its own share of every batch, and DDP averages the gradients (gloo
on CPU, NCCL on GPUs), so all copies stay identical.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise mean over processes (NaN-aware: a NaN entry counts as absent)."""
        if not self.enabled:
            return values
        present = (~torch.isnan(values)).float()
        both = torch.stack([torch.nan_to_num(values, nan=0.0), present]).to(self.device)
        dist.all_reduce(both)
        return (both[0] / both[1]).cpu()  # 0/0 -> NaN where no process had the value

    def any(self, flag: bool) -> bool:
        """True on every process if it is True on one (a cancel seen by rank 0 stops all)."""
        if not self.enabled:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(t)
        return bool(t.item() > 0)


def setup(device: str = "auto") -> Dist:
    """Join the process group when started by torchrun; pick the device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        from specui.errors import SpecUIError

        raise SpecUIError("--device cuda, but torch sees no CUDA device here")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Dist(rank=rank, world=world, local_rank=local_rank, device=dev)


def teardown(d: Dist) -> None:
    if d.enabled and dist.is_initialized():
        dist.destroy_process_group()
