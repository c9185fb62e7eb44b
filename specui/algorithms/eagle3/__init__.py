"""EAGLE-3: the autoregressive baseline (arXiv 2503.01840), and the EAGLE family's
shared code (P-EAGLE builds on every part of it).

config.py (Eagle3Config), model.py (Eagle3Model, Eagle3FirstLayer),
drafter.py (Eagle3Drafter, EagleRowCache), objective.py (Eagle3Objective,
pack_shifted); the registry entry below.
"""

from specui.algorithms.spec import package_spec, register_algorithm

SPEC = register_algorithm(
    package_spec(
        __name__,
        "Eagle3",
        label="EAGLE-3",
        rank=40,
        speculators_rank=0,
        default_layers=1,
    )
)
