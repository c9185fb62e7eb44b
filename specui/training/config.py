"""Everything one training run needs, in one plain dataclass (what the CLI and the job fill in).

Each shared setting is one field, declared with :func:`setting`: its default, its help, its
group.  The train CLI's flag (``specui.commands.train``), the Train tab's widget
(``specui.ui.train``) and the key in a job's params and a saved ``train_run.json``
(:meth:`TrainConfig.to_dict` / :meth:`TrainConfig.from_dict`) are all read from the fields, so a
new setting is its field here and the code that uses it.

An algorithm's own knobs are its package's options dataclass (``<algo>/options.py``, a
``TrainOptions``), held typed in ``TrainConfig.options`` (``cfg.options.block_size``); a saved
config and a job's params hold them flat beside the shared fields.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from specui.algorithms.options import TrainOptions, check_positive
from specui.algorithms.spec import ALGORITHMS, algorithm_names, train_knobs
from specui.data.prompts import mix_sources, refuse_evaluation_sets
from specui.errors import SpecUIError
from specui.trace import MAX_SPECULATIVE_TOKENS
from specui.training.vllm_extraction import find_python

SCHEDULES = ("cosine", "linear", "constant")
EXTRACTION_MODES = ("offline", "online", "mixed")
PRECISIONS = ("auto", "bf16", "fp32")
EXTRACTORS = ("local", "vllm")  # who computes the verifier's hidden states (training.targets)
LOSSES = ("ce", "kl")

# What a run trains on unless told otherwise: the corpus the shipped drafters train on,
# with the response length its shipped responses have (data/corpus/responses-*-n128.jsonl.gz).
# A longer default would generate again every response that reached 128 tokens (most of
# them: hours on a CPU) before the first step; a newcomer's first run should start at once.
# Longer responses stay one --max-new-tokens away (the cached ones that ended are reused).
DEFAULT_PROMPTS = "general"
DEFAULT_MAX_NEW_TOKENS = 128

# How an unknown value's message names a setting (others: by name).
_WHAT = {"matmul_precision": "training matmul precision", "extraction": "extraction mode"}

# The groups of the train CLI's help (and the order the Train tab lists its settings in).
GROUPS = ("run", "optimisation", "data", "drafter", "loss", "bookkeeping")


def setting(
    default: Any,
    help: str,
    *,
    group: str,
    flag: str | None = None,
    choices: tuple[str, ...] | None = None,
    tab: bool = True,
) -> Any:
    """A shared training setting: ``help`` is its CLI help and Train tab label, ``flag`` its
    CLI flag when not ``--`` + its name, ``choices`` the values it takes; ``tab=False`` keeps
    it off the Train tab (paths on the server, settings the tab fixes)."""
    if group not in GROUPS:
        raise ValueError(f"setting group must be one of {', '.join(GROUPS)}, got {group!r}")
    meta = {"help": help, "group": group, "flag": flag, "choices": choices, "tab": tab}
    return dataclasses.field(default=default, metadata=meta)  # MISSING: a required field


@dataclass
class TrainConfig:
    algorithm: str = setting(dataclasses.MISSING, "the algorithm to train", group="run", tab=False)
    verifier: str = setting(
        "embedded", "embedded | HF folder | .gguf file | hub id", group="run", tab=False
    )
    prompts: str = setting(
        DEFAULT_PROMPTS, "a registered prompt set or a JSONL file", group="run", tab=False
    )
    out: str = setting(
        "drafter",
        "output folder (final drafter, checkpoints/, metrics.jsonl)",
        group="run",
        tab=False,
    )
    resume: bool = setting(
        False, "continue from the last checkpoint in --out", group="run", tab=False
    )

    # --- optimisation
    steps: int = setting(200, "optimizer steps", group="optimisation", tab=False)
    batch_size: int = setting(4, "sequences per step (per process)", group="optimisation")
    lr: float = setting(6e-4, "learning rate", group="optimisation", tab=False)
    min_lr_ratio: float = setting(
        0.1, "the schedule decays to lr * min-lr-ratio", group="optimisation"
    )
    warmup_steps: int = setting(20, "steps of linear warmup", group="optimisation")
    schedule: str = setting(
        "cosine",
        "cosine | linear | constant (speculators' none = constant; the warmup still applies)",
        group="optimisation",
        choices=SCHEDULES,
    )
    weight_decay: float = setting(0.01, "AdamW weight decay", group="optimisation")
    grad_clip: float = setting(1.0, "gradient norm clip", group="optimisation")
    seed: int = setting(0, "seed of everything random", group="optimisation")
    threads: int | None = setting(
        None, "torch CPU threads (default: torch's)", group="optimisation", tab=False
    )
    device: str = setting("auto", "auto | cpu | cuda", group="optimisation", tab=False)
    # bf16 autocast (float32 master weights, softmax and losses), fp32, or auto: bf16 where the
    # device multiplies it fast (specui.training.step.compute_dtype).
    # Not `precision`: that word is the verifier's precision everywhere else (specui decode,
    # bench); saved runs and the old --precision flag still read (from_dict, OLD_SPELLINGS).
    matmul_precision: str = setting(
        "auto",
        "training matmuls: bf16 autocast with float32 master weights, fp32, or auto "
        "(bf16 where the CPU has AMX / AVX512-BF16, or on a GPU)",
        group="data",
        choices=PRECISIONS,
    )

    # --- data
    num_prompts: int | None = setting(None, "use the first N training prompts", group="data")
    max_new_tokens: int = setting(
        DEFAULT_MAX_NEW_TOKENS,
        "length of the self-distilled responses (default: that of the shipped general "
        "responses; a longer one generates again every response that reached it: hours on a CPU)",
        group="data",
    )
    gen_batch_size: int = setting(64, "rows the generator decodes at once", group="data")
    max_seq_len: int = setting(
        1024, "longer samples are cut (the loss needs the start of the response)", group="data"
    )
    # mixed: each sample's hidden states and targets extracted once, when first needed, and
    # kept, so a run starts at once and later epochs run no verifier; offline: all of them
    # first (long runs: no verifier in any step); online: never kept (specui.data.hidden)
    extraction: str = setting(
        "mixed",
        "hidden states and targets: mixed (each extracted once when first needed, then read "
        "from disk) | offline (all first: long runs) | online (never kept)",
        group="data",
        choices=EXTRACTION_MODES,
    )
    extract_batch_tokens: int = setting(
        4096, "padded tokens per batched extraction forward (local extractor)", group="data"
    )
    hidden_store: str = setting(
        "bf16",
        "how extracted hidden states are kept on disk: bf16 (vLLM's layout) | int8 (aux taps"
        " int8 per row: 2.6x smaller, for corpora that would not fit the disk)",
        group="data",
        choices=("bf16", "int8"),
    )
    cache_dir: str | None = setting(
        None, "responses and hidden states (default OUT/cache)", group="data", tab=False
    )
    extractor: str = setting(
        "local",
        "hidden states from the verifier in this process (local) or from a vLLM server the run"
        " launches, extracting offline and stopping it before training (vllm); both fill the"
        " same cache",
        group="data",
        tab=False,
    )
    vllm_python: str | None = setting(
        None,
        "with --extractor vllm: vLLM's Python (default $SPECUI_VLLM_PYTHON or "
        ".venv-vllm/bin/python)",
        group="data",
        tab=False,
    )
    # GPU builds: the trainer holds the verifier on the same GPU meanwhile, so vLLM's default
    # (0.9) may not fit.
    vllm_gpu_memory_utilization: float | None = setting(
        None,
        "with --extractor vllm on a GPU: vLLM's share of its memory (the trainer holds the"
        " verifier there too)",
        group="data",
        tab=False,
    )

    # --- drafter shape (each algorithm's own knobs live in its package's options.py)
    layers: int | None = setting(None, "draft decoder layers", group="drafter", tab=False)
    aux_layer_ids: list[int] | None = setting(
        None,
        "verifier layer ids, e.g. 2,15,27 (or 2 15 27); default the verifier's [2, n//2, n-3]",
        group="drafter",
        flag="--aux-layers",
        tab=False,
    )
    draft_vocab_size: int | None = setting(
        None, "reduced draft vocabulary (most frequent tokens)", group="drafter"
    )
    mask_token_id: int | None = setting(None, "the mask token's id", group="drafter")
    init_from: str | None = setting(
        None, "warm start from a checkpoint (DSpark from DFlash)", group="drafter", tab=False
    )
    num_speculative_tokens: int | None = setting(
        None,
        "K, the most drafts a proposal of the written speculator holds (default: what the"
        " algorithm trains: DFlash's block - 1, EAGLE-3's TTT steps, P-EAGLE's depths); EAGLE-3"
        " trained 4 TTT steps can draft 8",
        group="drafter",
        tab=False,
    )
    loss: str | None = setting(
        None, "override the per-slot loss: ce | kl (speculators' kl_div = kl)", group="loss",
        choices=LOSSES,
    )  # fmt: skip

    # --- bookkeeping
    log_every: int = setting(10, "steps between metrics lines", group="bookkeeping")
    checkpoint_every: int = setting(50, "steps between checkpoints", group="bookkeeping")
    keep_checkpoints: int = setting(2, "checkpoints kept", group="bookkeeping")
    snapshot_steps: list[int] | None = setting(
        None,
        "steps whose drafter is also kept for good as a speculator in OUT/snapshots/step-N"
        " (bf16, no optimizer state): a scaling study's points, e.g. 250,500,1000",
        group="bookkeeping",
        tab=False,
    )
    eval_every: int = setting(
        0,
        "every N steps, the drafter's metrics on held-out samples of the prompt set (expected"
        " acceptance length from per-position accuracy), logged as heldout_*; 0: never",
        group="bookkeeping",
    )
    eval_samples: int = setting(
        16,
        "held-out samples each evaluation scores (their responses are generated once)",
        group="bookkeeping",
    )

    # This algorithm's own knobs (its package's TrainOptions; None: its defaults).
    options: TrainOptions | None = None

    def __post_init__(self) -> None:
        self.algorithm = str(self.algorithm).lower()
        spec = ALGORITHMS.get(self.algorithm)
        if spec is None or not spec.trainable:
            raise SpecUIError(
                f"unknown algorithm {self.algorithm!r}; use one of"
                f" {', '.join(algorithm_names(trainable=True))}"
            )
        cls = spec.train_options_class
        if self.options is None and cls is not None:
            self.options = cls()
        elif cls is not None and not isinstance(self.options, cls):
            got = type(self.options).__name__
            raise SpecUIError(f"{self.algorithm}'s options are a {cls.__name__}, got {got}")
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value is not None and value not in choices:
                what = _WHAT.get(f.name, f.name.replace("_", " "))
                raise SpecUIError(f"unknown {what} {value!r}; use one of {', '.join(choices)}")
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
                "eval_samples": self.eval_samples,
            }
        )
        k = self.num_speculative_tokens
        if k is not None and not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise SpecUIError(
                f"num-speculative-tokens must be in 1..{MAX_SPECULATIVE_TOKENS}, got {k}"
            )
        if self.snapshot_steps is not None and any(int(s) < 1 for s in self.snapshot_steps):
            raise SpecUIError(f"snapshot-steps must be >= 1, got {self.snapshot_steps}")
        if self.eval_every < 0:
            raise SpecUIError(f"eval-every must be >= 0, got {self.eval_every}")
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
        if self.device not in ("auto", "cpu", "cuda"):
            raise SpecUIError(f"device must be auto, cpu or cuda, got {self.device!r}")
        self._check_extractor()

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

    @classmethod
    def settings(cls) -> list[dataclasses.Field]:
        """The shared settings (every field but ``options``), in declaration order."""
        return [f for f in dataclasses.fields(cls) if f.name != "options"]

    @classmethod
    def setting_type(cls, f: dataclasses.Field) -> type:
        """The type a setting's value has when set: ``int`` for ``int | None``, ``list`` for
        ``list[int] | None``."""
        hint = typing.get_type_hints(cls)[f.name]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            kinds = [a for a in typing.get_args(hint) if a is not type(None)]
            hint = kinds[0] if len(kinds) == 1 else hint
        return typing.get_origin(hint) or hint  # list for list[int]

    def to_dict(self) -> dict[str, Any]:
        """Flat, this algorithm's options beside the shared fields: a job's params, a saved
        run's config."""
        d = {f.name: getattr(self, f.name) for f in self.settings()}
        for key in ("aux_layer_ids", "snapshot_steps"):
            if d[key] is not None:
                d[key] = list(d[key])
        return d | (dataclasses.asdict(self.options) if self.options is not None else {})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """From a job's params, a saved run or parsed flags, flat: unknown keys are an error.

        Another algorithm's knobs are known names, and ignored (a saved run of an older SpecUI
        holds every algorithm's; speculators' CLI takes any).  ``extra``: an older run's
        ``{"loss": ...}``; ``precision``: an older run's ``matmul_precision``."""
        d = dict(d)
        if "algorithm" not in d or d["algorithm"] is None:
            raise SpecUIError("training options need an 'algorithm'")
        legacy = d.pop("extra", None) or {}
        if set(legacy) - {"loss"}:
            raise SpecUIError(f"unknown training options: {', '.join(sorted(legacy))}")
        if "loss" in legacy and d.get("loss") is None:
            d["loss"] = legacy["loss"]
        if "precision" in d:  # its name before matmul_precision
            d.setdefault("matmul_precision", d.pop("precision"))
        shared = {f.name for f in cls.settings()}
        knobs = train_knobs()
        unknown = sorted(set(d) - shared - set(knobs))
        if unknown:
            raise SpecUIError(f"unknown training options: {', '.join(unknown)}")
        spec = ALGORITHMS.get(str(d["algorithm"]).lower())
        options = None
        if spec is not None and spec.trainable and spec.train_options_class is not None:
            own = spec.train_options_class
            options = own(**{f.name: d[f.name] for f in dataclasses.fields(own) if f.name in d})
        return cls(**{k: v for k, v in d.items() if k in shared}, options=options)
