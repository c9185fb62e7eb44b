"""The drafting algorithms: one package each, in the speculators layout, plus what they share.

    base.py        Drafter / DraftContext (what the engine calls), DraftConfig, DraftModel,
    LearnedDrafter
    layers.py      decoder layer config, RMSNorm, RoPE, MLP, attention, draft-vocabulary maps
    checkpoint.py  speculators-format folders: validate, load, save
    spec.py        AlgorithmSpec and the registry every list of algorithms is read from
    simple.py      the drafters that need no training: none (plain decoding) and ngram
    resolve.py     what a user typed (none, ngram, a shipped name, a folder) -> a Drafter
    options.py     TrainOptions and knob: the base of an algorithm's training options
    <algo>/        config.py, model.py, drafter.py, objective.py, options.py; __init__.py registers
                   its AlgorithmSpec

Adding an algorithm is one folder: a package here (or anywhere, named in
``$SPECUI_ALGORITHMS``) whose ``__init__`` calls ``register_algorithm``.

Importing this package is cheap (no torch); the names below that need torch are
imported on first use.
"""

from specui.algorithms.spec import (
    ALGORITHMS,
    AlgorithmSpec,
    algorithm,
    algorithm_names,
    algorithm_specs,
    create_drafter,
    lazy_exports,
    register_algorithm,
)

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "DraftContext": "base",
        "Drafter": "base",
        "DraftConfig": "base",
        "DraftModel": "base",
        "LearnedDrafter": "base",
        "load_drafter": "checkpoint",
        "load_model": "checkpoint",
        "save_drafter": "checkpoint",
        "validate_checkpoint": "checkpoint",
    },
)

__all__ = [
    "ALGORITHMS",
    "AlgorithmSpec",
    "DraftConfig",
    "DraftContext",
    "DraftModel",
    "Drafter",
    "LearnedDrafter",
    "algorithm",
    "algorithm_names",
    "algorithm_specs",
    "create_drafter",
    "load_drafter",
    "load_model",
    "register_algorithm",
    "save_drafter",
    "validate_checkpoint",
]
