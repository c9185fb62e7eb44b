"""The registered algorithms of the two model families, for tests parametrized over them."""

from __future__ import annotations


def dflash_family() -> list[str]:
    """The registered algorithms that draft a block per pass (DFlash's model and its kin's)."""
    from specui.algorithms import algorithm, algorithm_names
    from specui.algorithms.dflash.model import DFlashModel

    return [n for n in algorithm_names() if issubclass(algorithm(n).model_class, DFlashModel)]


def eagle_family() -> list[str]:
    """The registered algorithms built on EAGLE-3's model (the shifted layout)."""
    from specui.algorithms import algorithm, algorithm_names
    from specui.algorithms.eagle3.model import Eagle3Model

    return [n for n in algorithm_names() if issubclass(algorithm(n).model_class, Eagle3Model)]


def family_founders() -> list[str]:
    """One algorithm of each family: the one whose model is the family's own class (DFlash,
    EAGLE-3), not a subclass."""
    from specui.algorithms import algorithm, algorithm_names
    from specui.algorithms.dflash.model import DFlashModel
    from specui.algorithms.eagle3.model import Eagle3Model

    return [n for n in algorithm_names() if algorithm(n).model_class in (DFlashModel, Eagle3Model)]
