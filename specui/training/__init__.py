"""Training drafters by self-distillation: one loop (``loop.py``) for every algorithm,
each bringing its objective (``specui/algorithms/<algo>/objective.py``).

    from specui.training import TrainConfig, train
    train(TrainConfig(algorithm="dflash", verifier="embedded", prompts="gsm-symbolic",
    out="runs/dflash"))

An algorithm's ``AlgorithmSpec`` names its ``Objective`` subclass (``build`` a fresh
drafter, ``loss`` of a batch through the model's own training-layout forward);
``objectives.py`` holds what they share.
"""

from typing import Any

__all__ = ["TrainConfig", "TrainHooks", "TrainResult", "train"]
_HOME = {"TrainConfig": "config", "TrainHooks": "loop", "TrainResult": "loop", "train": "loop"}


def __getattr__(name: str) -> Any:
    # Lazy: ``specui.jobs.training`` is imported by light processes (job listings)
    # that must not pay for torch.
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(f"specui.training.{_HOME[name]}"), name)
    raise AttributeError(f"module 'specui.training' has no attribute {name!r}")
