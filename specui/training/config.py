"""Everything one training run needs, in one dataclass (what the CLI and the job fill in).

The fields every algorithm shares are declared here; an algorithm's own knobs in its package's
options class (specui.algorithms.options), held in ``TrainConfig.options`` and read and written
flat, as if they were fields: ``TrainConfig(algorithm="dflash", block_size=4).block_size``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from specui.algorithms.options import check_positive
from specui.algorithms.spec import (
    ALGORITHMS,
    algorithm_names,
    algorithm_specs,
    train_defaults,
    train_knobs,
)
from specui.data.prompts import mix_sources, refuse_evaluation_sets
from specui.errors import SpecUIError
from specui.training.vllm_extraction import find_python

SCHEDULES = ("cosine", "linear", "constant")
EXTRACTION_MODES = ("offline", "online", "mixed")
PRECISIONS = ("auto", "bf16", "fp32")
EXTRACTORS = (
    "local",
    "vllm",
)  # who computes the verifier's hidden states (see specui.training.loop)

# What a run trains on unless told otherwise: the corpus the shipped drafters train on,
# with the response length its shipped responses have (data/corpus/responses-*-n128.jsonl.gz).
# A longer default would generate again every response that reached 128 tokens (most of
# them: hours on a CPU) before the first step; a newcomer's first run should start at once.
# Longer responses stay one --max-new-tokens away (the cached ones that ended are reused).
DEFAULT_PROMPTS = "general"
DEFAULT_MAX_NEW_TOKENS = 128

# The algorithms and their default draft depth (AlgorithmSpec.default_layers: one that
# trains in minutes on two CPU cores; the papers use 1 (EAGLE-3), 2-4 (P-EAGLE) and 5
# (DFlash) layers on GPUs) come from the registry, specui.algorithms.spec.


@dataclass(init=False)
class TrainConfig:
    algorithm: str
    verifier: str = "embedded"
    prompts: str = DEFAULT_PROMPTS  # a registered prompt set or a JSONL file
    out: str = "drafter"  # output folder: final drafter, checkpoints/, metrics.jsonl

    # --- optimisation
    steps: int = 200
    batch_size: int = 4  # sequences per step per process
    lr: float = 6e-4
    min_lr_ratio: float = 0.1  # the schedule decays to lr * min_lr_ratio
    warmup_steps: int = 20
    schedule: str = "cosine"
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    threads: int | None = None  # torch CPU threads (None: torch's default)
    device: str = "auto"  # auto | cpu | cuda
    # Matmuls of a training step: bf16 autocast (float32 master weights, softmax and losses),
    # fp32, or auto: bf16 where the device multiplies it fast (specui.training.step.compute_dtype).
    precision: str = "auto"

    # --- data
    num_prompts: int | None = None  # first N prompts of the train split (None: all)
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS  # self-distilled response length
    gen_batch_size: int = 64  # rows the generator decodes at once (continuous batching)
    max_seq_len: int = 1024  # longer samples are cut (the loss needs the start of the response)
    # mixed: each sample's hidden states and targets extracted once, when first needed, and
    # kept, so a run starts at once and later epochs run no verifier; offline: all of them
    # first (long runs: no verifier in any step); online: never kept (specui.data.hidden)
    extraction: str = "mixed"
    extract_batch_tokens: int = 4096  # padded tokens per extraction forward (local extractor)
    cache_dir: str | None = None  # responses + hidden states (default: OUT/cache)
    # Hidden states from the verifier in this process ("local") or from a vLLM server the
    # run launches and stops ("vllm"; it extracts offline, see specui.training.loop).
    extractor: str = "local"
    vllm_python: str | None = None  # vLLM's interpreter (default: $SPECUI_VLLM_PYTHON, .venv-vllm)
    # GPU builds: the share of GPU memory vLLM may take.  The trainer holds the verifier on
    # the same GPU meanwhile, so vLLM's default (0.9) may not fit.
    vllm_gpu_memory_utilization: float | None = None

    # --- drafter shape (each algorithm's own knobs, block_size ... ttt_steps, live in its
    # package's options.py: the `options` below, read as attributes, cfg.block_size)
    layers: int | None = None  # draft decoder layers (default per algorithm)
    aux_layer_ids: list[int] | None = None  # default: the verifier's [2, n//2, n-3]
    draft_vocab_size: int | None = None  # reduced draft vocabulary (most frequent tokens)
    mask_token_id: int | None = None
    init_from: str | None = None  # warm start from a checkpoint (DSpark from DFlash)

    # --- bookkeeping
    log_every: int = 10
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    resume: bool = False

    extra: dict[str, Any] = field(default_factory=dict)  # algorithm-specific knobs
    # Every registered algorithm's training options (specui.algorithms.spec.train_knobs), flat,
    # by name, a value for each: what a job's params and a saved run hold, keyword and attribute
    # alike.  Not only this algorithm's: the CLI passes them all, and each is checked by the
    # options class that declares it.
    options: dict[str, Any] = field(default_factory=dict)

    def __init__(self, algorithm: str, **kw: Any) -> None:
        """The generated __init__ plus the options as keywords: ``TrainConfig(algorithm="dflash",
        block_size=4)`` (an ``options`` dict, as dataclasses.replace passes it, merges too)."""
        knobs = train_knobs()
        options = dict(kw.pop("options", None) or {})
        options.update({k: kw.pop(k) for k in list(kw) if k in knobs})
        for f in dataclasses.fields(self):
            if f.name in ("algorithm", "options"):
                continue
            if f.name in kw:
                value = kw.pop(f.name)
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = f.default
            object.__setattr__(self, f.name, value)
        if kw:
            unexpected = ", ".join(sorted(kw))
            raise TypeError(f"TrainConfig() got unexpected keyword arguments: {unexpected}")
        self.algorithm = algorithm
        self.options = options
        self.__post_init__()

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: an algorithm's option, cfg.block_size.
        options = self.__dict__.get("options")
        if options is not None and name in options:
            return options[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        options = self.__dict__.get("options")
        if options is not None and name in options:
            options[name] = value
        else:
            object.__setattr__(self, name, value)

    def __post_init__(self) -> None:
        self.algorithm = str(self.algorithm).lower()
        spec = ALGORITHMS.get(self.algorithm)
        if spec is None or not spec.trainable:
            raise SpecUIError(
                f"unknown algorithm {self.algorithm!r}; use one of"
                f" {', '.join(algorithm_names(trainable=True))}"
            )
        self._check_options()
        if self.schedule not in SCHEDULES:
            raise SpecUIError(
                f"unknown schedule {self.schedule!r}; use one of {', '.join(SCHEDULES)}"
            )
        if self.precision not in PRECISIONS:
            raise SpecUIError(
                f"unknown training precision {self.precision!r}; use one of {', '.join(PRECISIONS)}"
            )
        if self.extraction not in EXTRACTION_MODES:
            raise SpecUIError(
                f"unknown extraction mode {self.extraction!r}; use one of"
                f" {', '.join(EXTRACTION_MODES)}"
            )
        check_positive(
            {
                "steps": self.steps,
                "batch_size": self.batch_size,
                "max_new_tokens": self.max_new_tokens,
                "gen_batch_size": self.gen_batch_size,
                "max_seq_len": self.max_seq_len,
                "log_every": self.log_every,
                "checkpoint_every": self.checkpoint_every,
                "keep_checkpoints": self.keep_checkpoints,
                "extract_batch_tokens": self.extract_batch_tokens,
            }
        )
        if self.layers is not None and self.layers < 1:
            raise SpecUIError(f"layers must be >= 1, got {self.layers}")
        if not self.lr > 0:
            raise SpecUIError(f"lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise SpecUIError(f"warmup-steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise SpecUIError(f"min-lr-ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise SpecUIError(f"num-prompts must be >= 1, got {self.num_prompts}")
        # Before any folder is made or model loaded: an evaluation set is never training data.
        refuse_evaluation_sets(mix_sources(str(self.prompts)))
        if self.threads is not None and self.threads < 1:
            raise SpecUIError(f"threads must be >= 1, got {self.threads}")
        if self.extra.get("loss", "ce") not in ("ce", "kl"):
            raise SpecUIError(f"unknown loss {self.extra['loss']!r}; use ce or kl")
        if self.device not in ("auto", "cpu", "cuda"):
            raise SpecUIError(f"device must be auto, cpu or cuda, got {self.device!r}")
        self._check_extractor()

    def _check_options(self) -> None:
        """Fill in the defaults (this algorithm's own where it declares a knob) and check every
        value with the options class that declares it."""
        knobs = train_knobs()
        unknown = sorted(set(self.options) - set(knobs))
        if unknown:
            raise SpecUIError(f"unknown training options: {', '.join(unknown)}")
        defaults = train_defaults(self.algorithm)
        self.__dict__["options"] = {name: self.options.get(name, defaults[name]) for name in knobs}
        for spec in algorithm_specs():
            cls = spec.train_options_class if spec.trainable else None
            if cls is not None:
                self._options_of(cls)  # its __post_init__ checks the values

    def _options_of(self, cls: type) -> Any:
        return cls(**{f.name: self.options[f.name] for f in dataclasses.fields(cls)})

    @property
    def algorithm_options(self) -> Any:
        """This algorithm's options as its own TrainOptions (None: it declares none)."""
        cls = ALGORITHMS[self.algorithm].train_options_class
        return None if cls is None else self._options_of(cls)

    def _check_extractor(self) -> None:
        self.extractor = str(self.extractor).lower()
        if self.extractor not in EXTRACTORS:
            raise SpecUIError(
                f"unknown extractor {self.extractor!r}; use one of {', '.join(EXTRACTORS)}"
            )
        if self.extractor != "vllm":
            if self.vllm_python is not None or self.vllm_gpu_memory_utilization is not None:
                raise SpecUIError(
                    "vllm-python and vllm-gpu-memory-utilization apply only with extractor vllm"
                )
            return
        u = self.vllm_gpu_memory_utilization
        if u is not None and not 0 < u <= 1:
            raise SpecUIError(f"vllm-gpu-memory-utilization must be in (0, 1], got {u}")
        # Found now, not after the self-distillation (which can take hours): the same
        # look-up the vLLM server launch does.
        find_python(self.vllm_python)

    @property
    def num_layers(self) -> int:
        return self.layers or ALGORITHMS[self.algorithm].default_layers

    def to_dict(self) -> dict[str, Any]:
        """Flat, the options beside the shared fields: a job's params, a saved run's config."""
        d = dataclasses.asdict(self)
        return d | d.pop("options")

    @classmethod
    def config_keys(cls) -> list[str]:
        """Every key of to_dict and from_dict: the shared fields, then the options by name."""
        shared = [f.name for f in dataclasses.fields(cls) if f.name != "options"]
        return shared + list(train_knobs())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """From a job's params or a saved run: unknown keys are an error, not ignored."""
        names = set(cls.config_keys())
        unknown = sorted(set(d) - names)
        if unknown:
            raise SpecUIError(f"unknown training options: {', '.join(unknown)}")
        if "algorithm" not in d:
            raise SpecUIError("training options need an 'algorithm'")
        return cls(**d)
