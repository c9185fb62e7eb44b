"""An algorithm's training options: one dataclass per algorithm, in its own package
(``<algo>/options.py``), named by its ``AlgorithmSpec.train_options``.

Each knob is declared once, as a field with its default and help: the train CLI's flag,
the Train tab's widget, ``TrainConfig``'s keyword and attribute, and the key in a job's
params and a saved ``train_run.json`` are all read from it (by the trainer's ``TrainConfig``).
Adding a knob to an algorithm is one field here, in its folder.

Torch-free: the registry imports these with the algorithm packages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from specui.errors import SpecUIError

GROUPS = ("drafter", "loss")  # the train CLI's argument groups a knob may sit in


def knob(default: Any, help: str, *, flag: str | None = None, group: str = "drafter") -> Any:
    """A training option: ``help`` follows the labels of the algorithms that read it
    ("DFlash/DSpark " + help); ``flag`` is its CLI flag when not ``--`` + its name."""
    if group not in GROUPS:
        raise ValueError(f"knob group must be one of {', '.join(GROUPS)}, got {group!r}")
    return dataclasses.field(default=default, metadata={"help": help, "flag": flag, "group": group})


def flag_of(f: dataclasses.Field) -> str:
    """The CLI flag of a knob: ``--block-size`` for ``block_size`` unless it names another."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def check_positive(values: Mapping[str, Any]) -> None:
    """SpecUIError naming the first value that is not a positive integer (as its flag)."""
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise SpecUIError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")


@dataclass(kw_only=True)
class TrainOptions:
    """The base of every algorithm's options: subclasses add ``knob`` fields, list the
    integer ones that must be >= 1 in ``positive`` and check the rest in ``check``."""

    positive: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        check_positive({name: getattr(self, name) for name in self.positive})
        self.check()

    def check(self) -> None:
        """Raise a SpecUIError for a bad value (the positive integers are already checked)."""
