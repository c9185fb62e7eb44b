"""DFlash: block-diffusion drafting, a whole block in one forward pass (arXiv 2602.06036).

config.py (DFlashConfig), model.py (DFlashModel), drafter.py (DFlashDrafter),
options.py (DFlashOptions: its training knobs),
objective.py (DFlashObjective); the registry entry below.
"""

from specui.algorithms.spec import AlgorithmSpec, lazy_exports, register_algorithm

SPEC = register_algorithm(AlgorithmSpec(
    name="dflash", label="DFlash", rank=10, speculators_rank=1, playground_rank=1,
    default_layers=2, vllm_method="dflash",
    drafter=f"{__name__}.drafter:DFlashDrafter", objective=f"{__name__}.objective:DFlashObjective",
    train_options=f"{__name__}.options:DFlashOptions",
))  # fmt: skip

__getattr__, __dir__ = lazy_exports(__name__, {
    "DFlashConfig": "config", "DFlashOptions": "options", "BlockOutput": "model",
    "DFlashModel": "model",
    "DFlashDrafter": "drafter", "DFlashObjective": "objective",
})  # fmt: skip
