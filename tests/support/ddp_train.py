"""Run by ``torchrun --nproc-per-node 2`` in test_training: a few DDP steps on the
fixture verifier; each rank writes its initial and final drafter weights."""

from __future__ import annotations

import os
import sys

import torch
from safetensors.torch import save_file

from specui.training import loop, step
from specui.training.config import TrainConfig

torch.set_num_threads(1)
out, verifier, prompts, cache = sys.argv[1:5]
rank = os.environ["RANK"]

build = step.StepModule.__init__


def record_init(self, model, objective):  # the weights every rank starts from
    os.makedirs(out, exist_ok=True)  # the run makes --out only when it first writes there
    save_file(
        {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
        f"{out}/rank{rank}-init.safetensors",
    )
    build(self, model, objective)


step.StepModule.__init__ = record_init
where = dict(verifier=verifier, prompts=prompts, out=out, cache_dir=cache)
schedule = dict(steps=4, batch_size=2, lr=3e-3, warmup_steps=1, log_every=2, checkpoint_every=100)
cfg = TrainConfig(
    algorithm="dflash", **where, **schedule, max_new_tokens=40, aux_layer_ids=[1, 3, 4]
)
result = loop.train(cfg)
save_file(
    {k: v.contiguous() for k, v in result.model.state_dict().items()},
    f"{out}/rank{rank}.safetensors",
)
