"""P-EAGLE: parallel EAGLE -- EAGLE-3 layers drafting all K tokens in one pass.

Built on ``specui.algorithms.eagle3`` (the EAGLE family's shared code):
config.py (PEagleConfig), model.py (PEagleModel), drafter.py (PEagleDrafter),
objective.py (PEagleObjective, cod_rows); the registry entry below.
"""

from specui.algorithms.spec import AlgorithmSpec, lazy_exports, register_algorithm

SPEC = register_algorithm(AlgorithmSpec(
    name="peagle", label="P-EAGLE", rank=30, speculators_rank=3, default_layers=2,
    drafter=f"{__name__}.drafter:PEagleDrafter", objective=f"{__name__}.objective:PEagleObjective",
    train_options=f"{__name__}.options:PEagleOptions",
    # vLLM rejects "method": "peagle"; without parallel_drafting it would silently run
    # the sequential EAGLE-3 path and skip mask_hidden.
    vllm_method="eagle3", vllm_extra={"parallel_drafting": True},
))  # fmt: skip

__getattr__, __dir__ = lazy_exports(__name__, {
    "PEagleConfig": "config", "PEagleOptions": "options", "PEagleModel": "model",
    "RowsOutput": "model",
    "PEagleDrafter": "drafter", "PEagleObjective": "objective", "cod_rows": "objective",
})  # fmt: skip
