"""Training drafters by self-distillation: one loop (``loop.py``), one objective per
algorithm (``dflash.py``, ``dspark.py``, ``peagle.py``, ``eagle3.py``).

    from specui.training import TrainConfig, train
    train(TrainConfig(algorithm="dflash", verifier="embedded", prompts="gsm-symbolic", out="runs/dflash"))

Adding an algorithm: a module ``specui/training/<algorithm>.py`` with an
``Objective`` subclass registered by ``@register_objective("<algorithm>")``
(``build`` a fresh drafter, ``loss`` of a batch through the drafter's own
training-layout forward), and the name in ``config.ALGORITHMS``.
"""


from typing import Any

__all__ = ["ALGORITHMS", "TrainConfig", "TrainHooks", "TrainResult", "train"]
_HOME = {"ALGORITHMS": "config", "TrainConfig": "config", "TrainHooks": "loop", "TrainResult": "loop", "train": "loop"}


def __getattr__(name: str) -> Any:
    # Lazy: ``specui.training.job`` is imported by light processes (job listings)
    # that must not pay for torch.
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(f"specui.training.{_HOME[name]}"), name)
    raise AttributeError(f"module 'specui.training' has no attribute {name!r}")
