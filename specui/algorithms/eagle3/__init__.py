"""EAGLE-3: the autoregressive baseline (arXiv 2503.01840), and the EAGLE family's
shared code (P-EAGLE builds on every part of it).

config.py (Eagle3Config), model.py (Eagle3Model, Eagle3FirstLayer),
drafter.py (Eagle3Drafter, EagleRowCache), objective.py (Eagle3Objective,
pack_shifted); the registry entry below.
"""

from specui.algorithms.spec import AlgorithmSpec, lazy_exports, register_algorithm

SPEC = register_algorithm(AlgorithmSpec(
    name="eagle3", label="EAGLE-3", rank=40, speculators_rank=0, default_layers=1, vllm_method="eagle3",
    drafter=f"{__name__}.drafter:Eagle3Drafter", objective=f"{__name__}.objective:Eagle3Objective",
    train_options=f"{__name__}.options:Eagle3Options",
))  # fmt: skip

__getattr__, __dir__ = lazy_exports(__name__, {
    "Eagle3Config": "config", "Eagle3Options": "options", "Eagle3FirstLayer": "model",
    "Eagle3Model": "model", "TTTOutput": "model",
    "Eagle3Drafter": "drafter", "EagleRowCache": "drafter", "Eagle3Objective": "objective",
    "pack_shifted": "objective",
})  # fmt: skip
