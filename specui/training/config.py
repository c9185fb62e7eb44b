"""Everything one training run needs, in one dataclass (what the CLI and the job fill in)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from specui.algorithms.spec import ALGORITHMS, algorithm_names
from specui.data.prompts import mix_sources, refuse_evaluation_sets
from specui.trace import SpecUIError
from specui.vllm.install import vllm_python

SCHEDULES = ("cosine", "linear", "constant")
EXTRACTION_MODES = ("offline", "online", "mixed")
PRECISIONS = ("auto", "bf16", "fp32")
EXTRACTORS = ("local", "vllm")  # who computes the verifier's hidden states (see specui.training.loop)

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


@dataclass
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
    # fp32, or auto: bf16 where the device multiplies it fast (specui.training.loop.compute_dtype).
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

    # --- drafter shape
    layers: int | None = None  # draft decoder layers (default per algorithm)
    block_size: int = 8  # DFlash/DSpark block B (who reads a field: AlgorithmSpec.train_fields)
    max_anchors: int = 64  # DFlash/DSpark anchors per sequence
    num_depths: int = 4  # P-EAGLE tokens per parallel pass (K)
    ttt_steps: int = 3  # EAGLE-3 training-time-test steps
    aux_layer_ids: list[int] | None = None  # default: the verifier's [2, n//2, n-3]
    draft_vocab_size: int | None = None  # reduced draft vocabulary (most frequent tokens)
    mask_token_id: int | None = None
    markov_rank: int = 256  # DSpark
    init_from: str | None = None  # warm start from a checkpoint (DSpark from DFlash)
    # P-EAGLE: keep the embedding the verifier's (frozen).  Saves ~V*H trainable parameters
    # and optimizer state, and the shipped checkpoint may then omit it (vLLM and SpecUI
    # borrow the verifier's); the P-EAGLE default trains its own.
    freeze_embeddings: bool = False

    # --- losses
    gamma: float = 4.0  # DFlash family: slot k weighted exp(-(k-1)/gamma)
    dpace: bool = False  # DFlash family: adaptive D-PACE weights instead of the fixed decay
    tv_weight: float = 0.0  # DSpark: loss = (1-w)*CE + w*TV on the draft distribution
    confidence_weight: float = 1.0  # DSpark: weight of the confidence head's BCE
    # DSpark: the sampling temperature whose acceptance the head learns: 1 - TV of the draft and
    # target distributions at that temperature; 0 is greedy, where that is "the argmaxes agree".
    confidence_temperature: float = 1.0
    cod_ratio: float = 0.7  # P-EAGLE draft-block sparsification: keep max(r^d, r_min)
    cod_min_ratio: float = 0.2

    # --- bookkeeping
    log_every: int = 10
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    resume: bool = False

    extra: dict[str, Any] = field(default_factory=dict)  # algorithm-specific knobs

    def __post_init__(self) -> None:
        self.algorithm = str(self.algorithm).lower()
        spec = ALGORITHMS.get(self.algorithm)
        if spec is None or not spec.trainable:
            raise SpecUIError(f"unknown algorithm {self.algorithm!r}; use one of {', '.join(algorithm_names(trainable=True))}")
        if self.schedule not in SCHEDULES:
            raise SpecUIError(f"unknown schedule {self.schedule!r}; use one of {', '.join(SCHEDULES)}")
        if self.precision not in PRECISIONS:
            raise SpecUIError(f"unknown training precision {self.precision!r}; use one of {', '.join(PRECISIONS)}")
        if self.extraction not in EXTRACTION_MODES:
            raise SpecUIError(f"unknown extraction mode {self.extraction!r}; use one of {', '.join(EXTRACTION_MODES)}")
        positive = {
            "steps": self.steps, "batch_size": self.batch_size, "max_new_tokens": self.max_new_tokens,
            "gen_batch_size": self.gen_batch_size, "max_seq_len": self.max_seq_len,
            "max_anchors": self.max_anchors, "num_depths": self.num_depths, "ttt_steps": self.ttt_steps,
            "log_every": self.log_every, "checkpoint_every": self.checkpoint_every,
            "keep_checkpoints": self.keep_checkpoints, "markov_rank": self.markov_rank,
            "extract_batch_tokens": self.extract_batch_tokens,
        }  # fmt: skip
        for name, value in positive.items():
            if not isinstance(value, int) or value < 1:
                raise SpecUIError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.block_size < 2:
            raise SpecUIError(f"block-size must be >= 2 (an anchor plus at least one drafted slot), got {self.block_size}")
        if self.layers is not None and self.layers < 1:
            raise SpecUIError(f"layers must be >= 1, got {self.layers}")
        if not self.lr > 0:
            raise SpecUIError(f"lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise SpecUIError(f"warmup-steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise SpecUIError(f"min-lr-ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not 0 <= self.tv_weight <= 1:
            raise SpecUIError(f"tv-weight must be in [0, 1], got {self.tv_weight}")
        if not self.confidence_temperature >= 0:
            raise SpecUIError(f"confidence-temperature must be >= 0, got {self.confidence_temperature}")
        if not self.gamma > 0:
            raise SpecUIError(f"gamma must be > 0, got {self.gamma}")
        if not (0 < self.cod_min_ratio <= 1 and 0 < self.cod_ratio <= 1):
            raise SpecUIError("cod-ratio and cod-min-ratio must be in (0, 1]")
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

    def _check_extractor(self) -> None:
        self.extractor = str(self.extractor).lower()
        if self.extractor not in EXTRACTORS:
            raise SpecUIError(f"unknown extractor {self.extractor!r}; use one of {', '.join(EXTRACTORS)}")
        if self.extractor != "vllm":
            if self.vllm_python is not None or self.vllm_gpu_memory_utilization is not None:
                raise SpecUIError("vllm-python and vllm-gpu-memory-utilization apply only with extractor vllm")
            return
        u = self.vllm_gpu_memory_utilization
        if u is not None and not 0 < u <= 1:
            raise SpecUIError(f"vllm-gpu-memory-utilization must be in (0, 1], got {u}")
        # Found now, not after the self-distillation (which can take hours): the same
        # look-up the vLLM server launch does.
        vllm_python(self.vllm_python)

    @property
    def num_layers(self) -> int:
        return self.layers or ALGORITHMS[self.algorithm].default_layers

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """From a job's params or a saved run: unknown keys are an error, not ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise SpecUIError(f"unknown training options: {', '.join(unknown)}")
        if "algorithm" not in d:
            raise SpecUIError("training options need an 'algorithm'")
        return cls(**d)
