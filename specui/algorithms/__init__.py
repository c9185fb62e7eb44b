"""The drafting algorithms: one package each, in the speculators layout, plus what they share.

    base.py        Drafter / DraftContext (what the engine calls), DraftModel, LearnedDrafter
    draft_config.py  DraftConfig: the fields every speculators config.json has
    layer_config.py  LayerConfig: the draft decoder layers' transformers config
    layers.py      RMSNorm, RoPE, MLP, attention, decoder layer, draft-vocabulary maps
    checkpoint.py  speculators-format folders: validate, load, save
    spec.py        AlgorithmSpec and the registry every list of algorithms is read from
    simple.py      the drafters that need no training: none (plain decoding) and ngram
    resolve.py     what a user typed (none, ngram, a shipped name, a folder) -> a Drafter
    options.py     TrainOptions and knob: the base of an algorithm's training options
    <algo>/        config.py, model.py, drafter.py, objective.py, options.py; __init__.py registers
                   its AlgorithmSpec

Adding an algorithm is one folder: a package here (or anywhere, named in
``$SPECUI_ALGORITHMS``) whose ``__init__`` calls ``register_algorithm``.

Importing this package is cheap (no torch): it holds the registry (spec.py); import the
rest from its module (``from specui.algorithms.base import Drafter``).
"""

from specui.algorithms.spec import (
    ALGORITHMS,
    AlgorithmSpec,
    algorithm,
    algorithm_names,
    algorithm_specs,
    create_drafter,
    register_algorithm,
)

__all__ = [
    "ALGORITHMS",
    "AlgorithmSpec",
    "algorithm",
    "algorithm_names",
    "algorithm_specs",
    "create_drafter",
    "register_algorithm",
]
