"""What every algorithm builds on: the Drafter interface, the model base class and the
inference helpers the learned drafters share.

* ``DraftContext`` / ``Drafter``: the one small interface the decoding loop
  (``specui.engine``) talks to;
* ``DraftConfig`` (``draft_config.py``): the fields every speculators ``config.json`` has
  (an algorithm's ``config.py`` subclasses it);
* ``DraftModel``: the ``nn.Module`` base with the checkpoint hooks (an
  algorithm's ``model.py``);
* ``LearnedDrafter``: the inference side every learned drafter shares (an
  algorithm's ``drafter.py``).

The building blocks of the models are in ``layers.py`` (their config in
``layer_config.py``); reading and writing
checkpoints in ``checkpoint.py``.

The decoding loop (``specui.engine``) owns the verifier and the committed
sequence.  Before each step it hands the drafter a ``DraftContext``:

* ``token_ids`` -- every committed token, prompt included.  The last one is the
  token the verifier emitted last (the bonus/corrected token) and has no
  verifier hidden state yet: it is the anchor of the next block.
* ``features`` -- the verifier's aux-layer hidden states for every committed
  position except the last, ``[L-1, n_aux * H]`` (``cat`` of the taps in the
  order of ``aux_layer_ids``), or ``None`` when the drafter asks for none.

Both only ever grow by appending between steps of one generation (rejected
tokens never reach them), so a drafter may keep incremental caches keyed by
their length.  ``reset()`` is called before each new generation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import nn

from specui.algorithms.draft_config import DraftConfig
from specui.algorithms.layers import (
    MLP,
    Attention,
    RMSNorm,
    init_weights,
    set_draft_vocab,
    to_target_vocab,
)
from specui.errors import SpecUIError
from specui.sampling import process_logits
from specui.trace import Proposal, SamplingParams

if TYPE_CHECKING:
    from specui.verifier.model import Verifier

# A drafting step's blocks (the new committed rows plus K draft rows) stay under this and run on
# the bf16 kernel where it runs; longer ones, a prompt's first step, go to oneDNN.
DRAFT_KERNEL_ROWS = 64


@dataclass
class DraftContext:
    token_ids: torch.Tensor  # [L] int64, committed tokens
    features: torch.Tensor | None  # [L-1, n_aux*H] verifier aux taps, or None
    sampling: SamplingParams
    generator: torch.Generator | None  # drafter-side randomness (sampling q)
    # Asked by the adaptive policy (``specui.policy``): fill ``Proposal.confidences`` with a
    # per-slot acceptance estimate where the drafter has one (learned: ``top1_confidences``).
    estimates: bool = False


@runtime_checkable
class Drafter(Protocol):
    """What the decoding loop needs from a drafter."""

    name: str  # shown in the UI and stored with runs
    algorithm: str  # an AlgorithmSpec name (speculators_model_type), or "none" / "ngram"
    # Verifier hidden-state layer ids this drafter conditions on (transformers
    # convention: 0 = embeddings, L = after L decoder layers), or None.
    aux_layer_ids: list[int] | None
    num_speculative_tokens: int  # K: the most tokens one proposal may hold
    # Optional, not part of the protocol check: ``stored_settings``, a dict of the drafter's
    # own settings that its runs store (the n-gram lookup's sizes).

    def reset(self) -> None: ...

    def propose(self, ctx: DraftContext) -> Proposal: ...


# --- what a drafter model class provides (see dflash/model.py for the pattern) ---------


class DraftModel(nn.Module):
    """Base of the four drafter ``nn.Module``s: a config plus the checkpoint hooks.

    ``state_dict()`` holds exactly the tensors the checkpoint stores (borrowed
    verifier modules are kept out of the module tree).  Keys in
    ``verifier_fallback`` may be absent from a checkpoint and are then copied
    from the verifier (the library does the same).

    What serving reads of a model (``layer_call``: the drafter's one serving path, in C or in
    torch), stated here once: ``layers`` (``DecoderLayer``s; the EAGLE family's first one reads
    ``[embedding; feature]``), ``norm`` (the final norm), ``rotary``, ``config.layer`` (widths
    and sliding windows), ``lm_head`` (normed rows -> draft logits), ``d2t`` (draft -> target
    ids, or None), and the two hooks below: ``head_module`` and ``context_projection``.
    """

    config_class: ClassVar[type[DraftConfig]]
    verifier_fallback: ClassVar[tuple[str, ...]] = ()
    config: DraftConfig

    @classmethod
    def initialised(
        cls,
        config: DraftConfig,
        verifier: Verifier,
        seed: int | None,
        draft_vocab: torch.Tensor | list[int] | None,
    ) -> DraftModel:
        """The shared tail of every ``create``: check ``config`` against the verifier, then a
        seeded initialisation and the reduced draft vocabulary (if any)."""
        problems = config.problems(verifier)
        if problems:
            raise SpecUIError("; ".join(problems))
        with seeded(seed):
            model = cls(config)
            init_weights(model, config.layer.initializer_range)
            model.init_extra()
        if draft_vocab is not None:
            set_draft_vocab(model, draft_vocab)
        return model

    def init_extra(self) -> None:
        """Subclass hook: initialisation beyond init_weights."""

    def bind_verifier(self, verifier: Verifier) -> None:
        """Borrow the frozen verifier parts this model uses but does not store."""

    def fallback_tensor(self, key: str, verifier: Verifier) -> torch.Tensor:
        """The verifier's tensor standing in for a missing ``key``."""
        raise KeyError(key)

    def head_module(self) -> nn.Module | None:
        """The module of the draft LM head (its own ``lm_head`` by default), for the one-call
        layers (``layer_call``)."""
        head = getattr(self, "lm_head", None)
        return head if isinstance(head, nn.Module) else None

    def context_projection(self) -> tuple[nn.Module, RMSNorm] | None:
        """The (linear, norm) that make context rows from the verifier's taps, ``norm(linear(
        taps))``, where the model's layers read such rows (``ctx_rows`` of the one-call layers);
        None by default."""
        return None

    def own_matmuls_outside(self) -> list[nn.Module]:
        """Layers the drafter owns but holds outside its modules (so outside its checkpoint),
        for ``LearnedDrafter.matmuls_in_bf16``; none by default."""
        return []


# --- the verifier parts a drafter borrows ---------------------------------------------------


@dataclass
class Borrowed:
    """Frozen verifier modules a drafter uses but does not own (nor save).

    Held in a plain dataclass so ``nn.Module`` does not register them: they stay
    out of the drafter's ``state_dict()``/``parameters()`` and the optimizer.
    """

    embed_tokens: nn.Embedding
    lm_head: nn.Module


# --- drafting helpers shared by the inference classes ---------------------------------------


def pick_tokens(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Target-vocabulary logits [k, V] -> (tokens [k], q [k, V]).

    q is the drafter's distribution after the same processing as the verifier's
    (temperature / top-k / top-p); greedy drafts the argmax (q one-hot on it).
    """
    q = process_logits(logits, sampling)
    if sampling.greedy:
        return logits.argmax(-1), q
    return torch.multinomial(q, 1, generator=generator).squeeze(-1), q


def pick_draft_tokens(
    logits: torch.Tensor,
    d2t: torch.Tensor | None,
    vocab_size: int,
    sampling: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draft-vocabulary logits [k, Vd] -> (target-vocabulary tokens [k], q [k, V] or None).

    Greedy drafts each row's argmax and returns no q: a deterministic proposal, which
    acceptance reads as q one-hot on its token, so no [k, V] row is built (two on a 49k
    vocabulary cost more than a small drafter's layers).  Sampling maps the logits to the
    target vocabulary and draws from the processed q (``pick_tokens``).
    """
    if sampling.greedy:
        best = logits.argmax(-1)
        return (best if d2t is None else best + d2t[best]), None
    return pick_tokens(to_target_vocab(logits, d2t, vocab_size), sampling, generator)


def top1_confidences(logits: torch.Tensor) -> list[float]:
    """Each draft row's largest softmax probability (temperature 1), the raw per-slot
    acceptance estimate of a learned drafter.  Row i's logits are made from the drafts before
    slot i only, so the estimate is known before slot i's token is drawn (the adaptive policy
    needs that for lossless sampling); the policy calibrates it."""
    return torch.softmax(logits.float(), dim=-1).amax(-1).tolist()


def stack_probs(qs: list[torch.Tensor | None]) -> torch.Tensor | None:
    """Per-slot q rows [V] -> [K, V], or None when the slots were drafted greedily (no q)."""
    return None if not qs or qs[0] is None else torch.stack(qs)


class PrefixCache:
    """Bookkeeping for a drafter's incremental cache over committed positions.

    The engine only ever appends committed tokens between steps of one
    generation; anything else (a new prompt without ``reset()``) is detected
    here by comparing token prefixes, and the caller rebuilds from scratch.
    """

    def __init__(self) -> None:
        self.tokens = torch.zeros(0, dtype=torch.long)

    def valid_length(self, token_ids: torch.Tensor, cached: int) -> int:
        """How many cached positions are still valid for ``token_ids`` (0 = rebuild)."""
        n = min(cached, self.tokens.numel(), token_ids.numel())
        if n < cached or not torch.equal(self.tokens[:n], token_ids[:n].cpu()):
            return 0
        return cached

    def remember(self, token_ids: torch.Tensor) -> None:
        self.tokens = token_ids.detach().cpu().clone()


class LearnedDrafter:
    """What the four learned drafters share on the inference side (the Drafter protocol).

    Subclasses set ``model_class`` and implement ``reset`` and ``propose``.
    ``self.model`` is the ``nn.Module`` (training uses it directly).
    """

    model_class: type
    # The layers in one C call on the bf16 kernels (``layer_call.DraftLayerCall``), set by
    # ``matmuls_in_bf16`` where it serves the model; else the same contract in torch
    # (``layer_call.TorchLayerCall``).  Either is the drafter's one serving path: ``call``.
    layer_call: Any = None
    _torch_call: Any = None

    def __init__(
        self,
        model: nn.Module,
        num_speculative_tokens: int | None = None,
        name: str | None = None,
        **options: Any,
    ) -> None:
        if options:
            raise SpecUIError(
                f"the {model.config.model_type} drafter has no option(s)"
                f" {', '.join(sorted(options))}"
            )
        self.model = model.eval()
        cfg = model.config
        self.algorithm: str = cfg.model_type
        self.name: str = name or cfg.model_type
        self.aux_layer_ids: list[int] | None = list(cfg.aux_layer_ids)
        k = cfg.num_speculative_tokens if num_speculative_tokens is None else num_speculative_tokens
        if k < 1:
            raise SpecUIError(f"num_speculative_tokens must be >= 1, got {k}")
        self.num_speculative_tokens: int = k
        self.reset()

    @classmethod
    def create(cls, verifier: Any, **sizes: Any) -> LearnedDrafter:
        """A freshly initialised drafter for ``verifier`` (see the model's ``create``)."""
        return cls(cls.model_class.create(verifier, **sizes))

    def reset(self) -> None:
        raise NotImplementedError

    def inputs(self, ctx: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Validated (token_ids [L], features [L-1, F]) on the model's device, float32."""
        device = next(p.device for p in self.model.parameters() if not p.is_meta)  # see serving
        ids = ctx.token_ids.reshape(-1).to(device)
        if ids.numel() == 0:
            raise SpecUIError("a drafter needs at least one committed token")
        width = len(self.model.config.aux_layer_ids) * self.model.config.layer.hidden_size
        feats = ctx.features
        if feats is None:
            raise SpecUIError(
                f"the {self.algorithm} drafter needs verifier features (aux layers"
                f" {self.aux_layer_ids})"
            )
        feats = feats.reshape(-1, feats.shape[-1]).to(device, torch.float32)
        if feats.shape[-1] != width or feats.shape[0] < ids.numel() - 1:
            raise SpecUIError(
                f"verifier features have shape {list(feats.shape)}; the {self.algorithm} drafter"
                f" needs [{ids.numel() - 1}, {width}] (aux layers {self.aux_layer_ids})"
            )
        return ids, feats[: ids.numel() - 1]

    def pick(
        self, logits: torch.Tensor, ctx: Any, greedy_tokens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft-vocabulary logits [k, Vd] -> (target tokens [k], q [k, V] or None), drawn with
        the context's sampling (``pick_draft_tokens``).  ``greedy_tokens``: the same rows' argmax
        in the target vocabulary where the one-call head made it already (``DraftCallOut``)."""
        if greedy_tokens is not None and ctx.sampling.greedy:
            return greedy_tokens, None
        m = self.model
        return pick_draft_tokens(
            logits, m.d2t, m.config.layer.vocab_size, ctx.sampling, ctx.generator
        )

    def matmuls_in_bf16(self, int8_rows: bool = False) -> None:
        """Run the drafter's matmuls on the bf16 kernels (beside a bf16, int8 or GGUF verifier:
        about a third less drafting time, and the verifier decides every token), with the
        layers its model holds outside its modules (``DraftModel.own_matmuls_outside``).

        ``int8_rows`` (beside a ``gguf-q8`` verifier): the one call's matmuls read each weight
        as Q8_0 blocks times rows made int8, the verifier's own kernel: half the bytes a draft
        streams.  The torch modules keep their bf16 weights (training, the reference), and so
        does DSpark's Markov chain (it reads single bf16 rows of W1)."""
        from specui.verifier.batch_invariant import bf16_matmuls, to_bf16_linear

        for module in (self.model, *self.model.own_matmuls_outside()):
            bf16_matmuls(module, kernel_rows=DRAFT_KERNEL_ROWS)
        # q/k/v and gate/up stacked into one matmul each: a call, not three (two), a layer.
        for module in self.model.modules():
            if isinstance(module, Attention | MLP):
                module.fuse(lambda linear: to_bf16_linear(linear, DRAFT_KERNEL_ROWS))
        if int8_rows:
            from specui.kernels.packing import pack_gguf, quantize_q8_0

            for linear in self.call_linears():
                w = getattr(linear, "weight", None)
                if getattr(linear, "weight_kernel", None) is None or w is None or w.is_meta:
                    continue
                if w.shape[1] % 32 == 0:
                    raw = quantize_q8_0(w)
                    linear.weight_q8 = pack_gguf(raw, "Q8_0", w.shape[1], rows="int8")
        from specui.algorithms.layer_call import DraftLayerCall

        self.layer_call = DraftLayerCall.build(self.model, self.model.head_module())
        self._torch_call = None  # a cache of the other path's is no longer the drafter's
        self.reset()

    def call_linears(self) -> list[nn.Module]:
        """The linears the one call multiplies by: each layer's stacked q/k/v and gate/up (not
        the parts they stack), the rest of the model's, and those it holds outside its modules."""
        parts: set[int] = set()
        stacked: list[nn.Module] = []
        for module in self.model.modules():
            if isinstance(module, Attention | MLP) and module.stacked is not None:
                stacked.append(module.stacked.first)
                for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
                    part = getattr(module, name, None)
                    if part is not None:
                        parts.add(id(part))
        own = [
            m
            for module in (self.model, *self.model.own_matmuls_outside())
            for m in module.modules()
            if id(m) not in parts
        ]
        return own + stacked

    @property
    def call(self) -> Any:
        """The drafter's layers as one call: the C one where ``matmuls_in_bf16`` built it, else
        the same contract in torch ops over the model's modules (``layer_call``), made once."""
        if self.layer_call is not None:
            return self.layer_call
        if self._torch_call is None:
            from specui.algorithms.layer_call import TorchLayerCall

            self._torch_call = TorchLayerCall(self.model)
        return self._torch_call

    def empty_proposal(self) -> Any:
        return Proposal(token_ids=[], probs=torch.zeros(0, self.model.config.layer.vocab_size))


def verifier_identity(verifier: Any) -> dict[str, Any]:
    """The verifier fields a new checkpoint records (speculators_config.verifier)."""
    from specui.verifier.embedded import EMBEDDED_HUB_ID, EMBEDDED_NAME

    cfg = verifier.config
    path = (
        getattr(cfg, "_name_or_path", None) or getattr(cfg, "name_or_path", None) or verifier.name
    )
    if (
        verifier.name == EMBEDDED_NAME
    ):  # its folder is a cache path on this machine: record the hub id
        path = EMBEDDED_HUB_ID
    from transformers import PreTrainedModel

    architectures = list(getattr(cfg, "architectures", None) or [])
    model = getattr(verifier, "model", None)
    if not architectures and isinstance(model, PreTrainedModel):
        # A config made from a GGUF file (transformers 5.x) names none: the loaded class is it.
        architectures = [type(model).__name__]
    return {"verifier_name_or_path": str(path), "verifier_architectures": architectures}


@contextlib.contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Initialise a fresh model from ``seed`` without disturbing the global RNG."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
