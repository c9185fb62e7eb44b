"""DFlash: block-diffusion drafting, a whole block in one forward pass (arXiv 2602.06036).

config.py (DFlashConfig), model.py (DFlashModel), drafter.py (DFlashDrafter),
options.py (DFlashOptions: its training knobs),
objective.py (DFlashObjective); the registry entry below.
"""

from specui.algorithms.spec import package_spec, register_algorithm

SPEC = register_algorithm(
    package_spec(
        __name__,
        "DFlash",
        label="DFlash",
        rank=10,
        speculators_rank=1,
        default_layers=2,
    )
)
