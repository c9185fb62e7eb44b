"""P-EAGLE: parallel EAGLE -- EAGLE-3 layers drafting all K tokens in one pass.

Built on ``specui.algorithms.eagle3`` (the EAGLE family's shared code):
config.py (PEagleConfig), model.py (PEagleModel), drafter.py (PEagleDrafter),
objective.py (PEagleObjective, cod_rows); the registry entry below.
"""

from specui.algorithms.spec import package_spec, register_algorithm

SPEC = register_algorithm(
    package_spec(
        __name__,
        "PEagle",
        label="P-EAGLE",
        rank=30,
        speculators_rank=3,
        default_layers=2,
        # vLLM rejects "method": "peagle"; without parallel_drafting it would silently run
        # the sequential EAGLE-3 path and skip mask_hidden.
        vllm_method="eagle3",
        vllm_extra={"parallel_drafting": True},
    )
)
