#!/usr/bin/env python3
"""Regenerate (or check) the speculators 0.9.0 conformance fixtures with the real library.

    scripts/setup_speculators.sh                                   # once: .venv-speculators
    .venv-speculators/bin/python scripts/make_fixtures.py          # a fresh set in a temp folder
    .venv-speculators/bin/python scripts/make_fixtures.py --check  # ... compared with the committed
    # replace the committed set:
    .venv-speculators/bin/python scripts/make_fixtures.py --out tests/fixtures/speculators-0.9.0

(Any other interpreter re-executes itself with ``.venv-speculators/bin/python``
when that exists.)  The test suite never runs this script and never needs its venv:
it reads the committed set in ``tests/fixtures/speculators-0.9.0``.

What one run does, all float32 on CPU with eager attention:

1. ``verifier/``: a tiny random ``Qwen3ForCausalLM`` (transformers' own init under
   a fixed seed, then every RMSNorm gain set to ``1 + 0.2 N(0,1)`` so that a missing
   norm is visible), written by ``save_pretrained``; ``reference.safetensors`` holds a
   fixed token sequence, its per-layer residual-stream taps and its logits.
2. ``dflash/ dspark/ eagle3/ peagle/``: each draft built the way the speculators
   trainer builds it (``speculators.train.cli.create_transformer_layer_config`` +
   ``<Model>.from_training_args``, so the verifier-owned weights come from the
   library's ``load_verifier_weights``), its trainable weights randomised under a
   per-algorithm seed (a trained-looking scale, so a wrong connection shows up in
   the logits), written by the library's ``save_pretrained`` and reloaded with
   ``SpeculatorModel.from_pretrained``.  The reference tensors are what the reloaded
   library model computes: the sample is laid out with the library's own
   ``BaseDataset.__getitem__`` + ``CollateFn`` (+ ``shift_batch`` for the EAGLE
   family), the outputs are read from the library's forward passes through forward
   hooks and recording wrappers (nothing is recomputed by hand for the references).
3. A self-check: an independent plain-torch implementation of the math that each
   ``REFERENCE.md`` documents, fed only the files on disk, must reproduce every
   reference within 1e-4; plus a reload check and (DFlash) a prefix-dependence
   sanity check.  ``manifest.json`` and ``README.md`` record versions, parameters,
   sizes, hashes and these results.

Reproducibility.  The committed set was written with torch 2.14.1+cu130; this
machine's venv has torch 2.13.0+cpu (both CPU math, transformers 5.19.0).  Under
those versions the verifier (config.json, generation_config.json, model.safetensors)
and all four draft ``model.safetensors`` come out byte-identical; in the references
every integer / bool tensor (token ids, positions, anchors, the P-EAGLE COD rows) is
identical and every float tensor (taps, logits, ...) agrees within ~5e-6, the
rounding difference of the two torch builds' kernels.  What is never byte-identical:
``config.json``'s ``speculators_config.verifier.name_or_path`` (the library records
wherever the verifier lay when it was written, relative to the working directory
when possible), the version strings inside ``reference.safetensors`` metadata and
``manifest.json``/``README.md``, and the ``REFERENCE.md`` prose (written by this
script in its own words; the committed files came from an earlier generator).  The
DFlash prefix-sanity magnitudes depend on which replacement tokens are drawn (only
"zero after the anchor, non-zero at or before it" is enforced).  ``--check``
therefore compares configs (minus ``name_or_path`` and ``transformers_version``),
tensor names / dtypes / shapes and values up to ``--tol``, and runs the independent
self-check on both the new and the committed set; exit status 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported late: the script may first re-execute itself in its own venv
    from torch import Tensor, nn

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "tests" / "fixtures" / "speculators-0.9.0"
VENV_PY = REPO / ".venv-speculators" / "bin" / "python"
SPECULATORS_VERSION = "0.9.0"
ALGOS = ("dflash", "dspark", "eagle3", "peagle")

sys.path.insert(0, str(REPO))
from specui.errors import SpecUIError  # noqa: E402  (torch-free; the only specui import here)

# Every size and seed of the set.  Changing one changes the fixtures: the tests
# read the values back from config.json / reference.safetensors, never from here.
PARAMS: dict[str, Any] = {
    "seed": 20240611,
    "vocab": 512,
    "hidden": 64,
    "layers": 6,
    "heads": 4,
    "kv_heads": 2,
    "head_dim": 16,
    "intermediate": 128,
    "rope_theta": 10000.0,
    "aux_ids": [1, 3, 4],
    "block_size": 8,
    "num_depths": 4,
    "seq_len": 48,
    "dflash_anchor": 20,
    "peagle_anchor": 20,
    "dflash_layers": 2,
    "eagle3_layers": 1,
    "peagle_layers": 2,
    "markov_rank": 16,
    "ttt_steps": 3,
    "size_limit_bytes": 5 * 1024 * 1024,
}
# Offsets from PARAMS["seed"]; kept apart so that no two random draws share a stream.
NORM_GAIN_SEED = 1  # verifier RMSNorm gains
TOKEN_SEED = 7  # the fixed token sequence
SANITY_SEED = 8  # replacement tokens of the DFlash prefix check
DRAFT_SEEDS = {"dflash": 200, "dspark": 201, "eagle3": 202, "peagle": 203}  # 20240811..14
COD_SEED = 4242  # torch.manual_seed(seed + this) before P-EAGLE's random COD sampling
SELF_CHECK_TOL = 1e-4
REMOVED_AFTER_SAVE = ["config.py"]  # library source the HF save copies for auto_map
# The collated batch's inputs to a drafter's forward.
BATCH_KEYS = (
    "hidden_states",
    "input_ids",
    "loss_mask",
    "verifier_last_hidden_states",
    "document_ids",
    "position_ids",
)


def _ensure_speculators() -> None:
    """Import speculators 0.9.0, re-executing under .venv-speculators when this interpreter lacks
    it."""
    try:
        import speculators.version as sv
    except ImportError:
        sv = None
    if sv is not None and sv.version == SPECULATORS_VERSION:
        return
    # Compare venvs, not interpreters: every venv's python links to the same base binary.
    if VENV_PY.is_file() and Path(sys.prefix).resolve() != VENV_PY.parent.parent.resolve():
        os.execv(str(VENV_PY), [str(VENV_PY), str(Path(__file__).resolve()), *sys.argv[1:]])
    found = "not importable" if sv is None else f"version {sv.version}"
    raise SpecUIError(
        f"speculators {SPECULATORS_VERSION} is needed but is {found} in {sys.executable}; run "
        "scripts/setup_speculators.sh first (it creates .venv-speculators)"
    )


# --------------------------------------------------------------------------- small helpers


def _versions() -> dict[str, str]:
    import safetensors
    import speculators.version
    import torch
    import transformers

    return {
        "speculators": speculators.version.version,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
    }


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _max_diff(a: Tensor, b: Tensor) -> float:
    return float((a.double() - b.double()).abs().max().item()) if a.numel() else 0.0


@contextlib.contextmanager
def _hooks(spec: list[tuple[nn.Module, Callable[..., None]]]) -> Iterator[None]:
    """Forward hooks (module, fn(module, args, output)) removed again on exit, even on error."""
    handles = [module.register_forward_hook(fn) for module, fn in spec]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _replaced(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """Set ``owner.name = make(original)`` for the duration (library functions looked up at call
    time)."""
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def _wrapped(
    owner: Any, name: str, record: Callable[..., None]
) -> contextlib.AbstractContextManager:
    """Wrap ``owner.name`` so that every call is recorded as record(args, kwargs, result), then
    passed through."""

    def make(original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            record(args, kwargs, out)
            return out

        return wrapper

    return _replaced(owner, name, make)


def _first(output: Any) -> Any:
    return output[0] if isinstance(output, tuple) else output


def _recorded_path(path: Path) -> str:
    """The verifier path as the library records it: relative to the working directory when inside
    it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


# --------------------------------------------------------------------------- the verifier


def build_verifier(folder: Path) -> nn.Module:
    """Write the tiny Qwen3 verifier with transformers' own init and save path; return it (eval,
    eager)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    p = PARAMS
    cfg = Qwen3Config(
        vocab_size=p["vocab"],
        hidden_size=p["hidden"],
        intermediate_size=p["intermediate"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        head_dim=p["head_dim"],
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": p["rope_theta"]},
        # A wide init (HF default is 0.02) so that taps and logits are far from uniform.
        initializer_range=0.1,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(p["seed"])
    model = Qwen3ForCausalLM(cfg).float()
    g = torch.Generator().manual_seed(p["seed"] + NORM_GAIN_SEED)
    with torch.no_grad():  # HF inits norm gains to 1, which would hide a forgotten norm
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=g))
    model.save_pretrained(folder)
    return model.eval()


def verifier_taps(model: nn.Module, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(taps [N+1,T,H], HF post-norm last hidden [T,H], logits [T,V]) of one sequence, via hooks.

    tap[L] is the residual stream after L decoder layers (tap[N] BEFORE the final
    norm), which is what vLLM captures for layer id L and what the trainer stores.
    """
    import torch

    layers = model.model.layers
    got: dict[int, Any] = {}
    spec = [(model.model.embed_tokens, lambda m, a, o: got.__setitem__(0, o[0].detach().clone()))]
    for i, layer in enumerate(layers):
        spec.append(
            (layer, lambda m, a, o, i=i: got.__setitem__(i + 1, _first(o)[0].detach().clone()))
        )
    with torch.no_grad(), _hooks(spec):
        out = model(input_ids=ids[None], output_hidden_states=True)
    taps = torch.stack([got[i] for i in range(len(layers) + 1)])
    return taps, out.hidden_states[-1][0].detach().clone(), out.logits[0].detach().clone()


def fixed_tokens() -> Tensor:
    import torch

    g = torch.Generator().manual_seed(PARAMS["seed"] + TOKEN_SEED)
    # Never V-1: that id is the drafts' mask token.
    return torch.randint(0, PARAMS["vocab"] - 1, (PARAMS["seq_len"],), generator=g)


# --------------------------------------------------------------------------- the drafts


def build_draft(algo: str, verifier_dir: Path) -> nn.Module:
    """The draft as the speculators trainer creates it (full-attention layers), before
    randomising."""
    from speculators.models.dflash.core import DFlashDraftModel
    from speculators.models.dspark.core import DSparkDraftModel
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.models.peagle.core import PEagleDraftModel
    from speculators.train.cli import create_transformer_layer_config

    p = PARAMS
    n_layers = p[f"{algo}_layers"] if f"{algo}_layers" in p else p["dflash_layers"]
    # The trainer's own defaults: llama layers for EAGLE-3, qwen3 for the others.
    arch = "llama" if algo == "eagle3" else "qwen3"
    # Every draft layer full attention (the trainer's CLI default would be sliding).
    tl = create_transformer_layer_config(
        str(verifier_dir), n_layers, arch, None, 2048, list(range(n_layers))
    )
    common = {
        "verifier_name_or_path": _recorded_path(verifier_dir),
        "draft_vocab_size": p["vocab"],
        "target_layer_ids": list(p["aux_ids"]),
        "draft_attn_impl": "eager",
    }
    mask_id = p["vocab"] - 1
    block = dict(block_size=p["block_size"], mask_token_id=mask_id)
    if algo == "dflash":
        return DFlashDraftModel.from_training_args(tl, **block, **common)
    if algo == "dspark":
        markov = dict(markov_rank=p["markov_rank"], markov_head_type="vanilla")
        return DSparkDraftModel.from_training_args(tl, **block, **markov, **common)
    if algo == "eagle3":
        # The trainer's eagle3 flags (they differ from the config class defaults).
        flags = dict(norm_before_residual=True, norm_before_fc=True, norm_output=True)
        return Eagle3DraftModel.from_training_args(tl, ttt_steps=p["ttt_steps"], **flags, **common)
    if algo == "peagle":
        depths = dict(num_depths=p["num_depths"], mask_token_id=mask_id)
        return PEagleDraftModel.from_training_args(
            tl, **depths, norm_before_residual=True, **common
        )
    raise SpecUIError(f"unknown algorithm {algo!r} (known: {', '.join(ALGOS)})")


def randomise_trainable(model: nn.Module, seed: int) -> list[str]:
    """Give every trainable parameter a trained-looking random value; return the frozen names.

    A freshly initialised draft has unit norm gains, zero-ish Markov weights and so
    on, which would let an implementation that skips a term still match.  Frozen,
    verifier-owned weights (requires_grad False after from_training_args) are kept.
    Order: model.named_parameters(), one generator, so the values are reproducible.
    """
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(seed)
    frozen = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not param.requires_grad:
                frozen.append(name)
                continue
            owner = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            r = torch.randn(param.shape, generator=g)
            if name.endswith(".bias"):
                param.copy_(0.1 * r)
            elif isinstance(owner, nn.Linear):
                param.copy_(r / param.shape[1] ** 0.5)  # unit-variance outputs for unit inputs
            elif (
                isinstance(owner, nn.Embedding) or owner is model
            ):  # embeddings, markov_w1, mask_hidden
                param.copy_(r)
            elif type(owner).__name__.endswith("RMSNorm"):
                param.copy_(1 + 0.2 * r)
            else:
                raise SpecUIError(
                    f"no randomisation rule for parameter {name} ({type(owner).__name__})"
                )
    return frozen


def reload_draft(folder: Path, verifier_dir: Path) -> nn.Module:
    """The saved draft reloaded through the library (eager attention; verifier = the sibling
    folder)."""
    from speculators import SpeculatorModel, SpeculatorModelConfig

    cfg = SpeculatorModelConfig.from_pretrained(str(folder))
    # In memory only: the recorded path may be relative to another working directory.
    cfg.speculators_config.verifier.name_or_path = str(verifier_dir.resolve())
    cfg.transformer_layer_config._attn_implementation = "eager"
    return SpeculatorModel.from_pretrained(str(folder), config=cfg).eval()


def collate(sample: dict[str, Tensor], shifted: bool) -> dict[str, Tensor]:
    """One training batch laid out by the library itself (BaseDataset + CollateFn [+
    shift_batch])."""
    import torch
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import BaseDataset, CollateFn

    class OneSample(BaseDataset):
        def _compute_approx_lengths(self) -> list[int]:
            return [int(sample["input_ids"].shape[0])]

        def _get_raw_data(self, index: int) -> dict[str, Any]:
            return {k: v.clone() for k, v in sample.items()}

        def __len__(self) -> int:
            return 1

    T = int(sample["input_ids"].shape[0]) - (1 if shifted else 0)
    item = OneSample(max_len=T, hidden_states_dtype=torch.float32)[0]
    n_aux = len(PARAMS["aux_ids"])
    batch = CollateFn(
        T, PARAMS["hidden"], n_aux, dtype=torch.float32, preprocess=shift_batch if shifted else None
    )([item])
    return {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}


def raw_sample(taps: Tensor, ids: Tensor, loss_mask: Tensor) -> dict[str, Tensor]:
    """The trainer's per-sample layout: aux taps concatenated, plus tap[N] for the targets."""
    import torch

    aux = PARAMS["aux_ids"]
    return {
        "hidden_states": torch.cat([taps[i] for i in aux], -1),
        "input_ids": ids.clone(),
        "verifier_last_hidden_states": taps[-1].clone(),
        "loss_mask": loss_mask,
    }


def _forward_kwargs(model: nn.Module, **args: Any) -> dict[str, Any]:
    """The training-forward keyword arguments the library's trainer would pass (CPU loss
    kernels)."""
    # "eager" losses: the default fused ones need Triton (a GPU).  The loss value itself
    # is not part of any reference; the forward only has to run.
    train, _ = type(model).get_trainer_kwargs(loss_fn="kl_div", loss_implementation="eager", **args)
    return train


def dflash_family_reference(
    model: nn.Module, batch: dict[str, Tensor], algo: str
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Reference tensors of one anchored block (+ DSpark heads); returns (tensors, checks)."""
    import torch

    B = model.block_size
    got: dict[str, Any] = {"layers": []}
    spec = [
        (model.hidden_norm, lambda m, a, o: got.__setitem__("fc_output", o.detach().clone())),
        (model.embed_tokens, lambda m, a, o: got.__setitem__("block_ids", a[0].detach().clone())),
        (model.rotary_emb, lambda m, a, o: got.__setitem__("positions", a[1].detach().clone())),
    ]
    spec += [
        (layer, lambda m, a, o: got["layers"].append(_first(o)[0].detach().clone()))
        for layer in model.layers
    ]
    inputs = {k: batch[k] for k in BATCH_KEYS}
    with torch.no_grad(), _hooks(spec):
        hidden, logits, targets, block_mask, block_idx = model._backbone_forward(
            **inputs, max_anchors=1
        )
    p = int(block_idx[0])
    sfa = bool(model.config.sample_from_anchor)
    ref = {
        **batch,
        "anchor_position": torch.tensor([p]),
        "block_input_ids": got["block_ids"][0],
        "block_position_ids": got["positions"][0, -B:],
        "block_predicted_positions": torch.arange(p, p + B) + (1 if sfa else 0),
        "fc_output": got["fc_output"],
        "block_layer_outputs": torch.stack(got["layers"]),
        "block_hidden": hidden,
        "block_logits": logits,
        "block_targets": targets,
        "block_loss_mask": block_mask,
    }
    checks: dict[str, Any] = {}
    if algo == "dspark":
        import speculators.models.dspark.core as dspark_core

        rec: dict[str, Any] = {}

        def record(
            args: tuple, kwargs: dict, out: Any
        ) -> None:  # compute_metrics(logits, targets, conf, ...)
            rec["markov_logits"], rec["confidence_logits"] = (
                args[0].detach().clone(),
                args[2].detach().clone(),
            )

        head = model.markov_head
        spec = [
            (head.markov_w1, lambda m, a, o: rec.__setitem__("prev", a[0].detach().clone())),
            (head.markov_w2, lambda m, a, o: rec.__setitem__("bias", o.detach().clone())),
        ]
        with torch.no_grad(), _hooks(spec), _wrapped(dspark_core, "compute_metrics", record):
            model(**inputs, **_forward_kwargs(model, max_anchors=1))
        prev = rec["prev"].reshape(-1)
        ref.update(
            markov_prev_token_ids=prev,
            markov_bias=rec["bias"].reshape(1, B, -1),
            markov_logits=rec["markov_logits"],
            confidence_logits=rec["confidence_logits"],
        )
        with torch.no_grad():  # the same heads applied by hand to the backbone outputs
            e = head.markov_w1(prev)
            manual = logits[0] + head.markov_w2(e)
            conf = model.confidence_head.proj(torch.cat([hidden[0], e], -1)).squeeze(-1)
        checks["markov_logits_forward_vs_manual"] = _max_diff(manual, rec["markov_logits"][0])
        checks["confidence_forward_vs_manual"] = _max_diff(conf, rec["confidence_logits"][0])
    return ref, checks


def eagle3_reference(
    model: nn.Module, batch: dict[str, Tensor]
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Logits of every TTT step of the library's training forward (teacher-forced)."""
    import torch

    S = PARAMS["ttt_steps"]
    got: dict[str, list] = {"logits": [], "ids": [], "pos": [], "targets": []}
    spec = [
        (model.lm_head, lambda m, a, o: got["logits"].append(o[0].detach().clone())),
        (model.embed_tokens, lambda m, a, o: got["ids"].append(a[0][0].detach().clone())),
        (model.rotary_emb, lambda m, a, o: got["pos"].append(a[1][0].detach().clone())),
        (model.verifier_lm_head, lambda m, a, o: got["targets"].append(o.detach().clone())),
    ]
    with torch.no_grad(), _hooks(spec):
        draft_tokens, _, _ = model(
            **batch, **_forward_kwargs(model, ttt_steps=S, ttt_step_loss_decay=1.0)
        )
    T1 = batch["input_ids"].shape[1]
    logits = torch.stack(got["logits"])
    ref = {
        **batch,
        "step_input_ids": torch.stack(got["ids"]),
        "step_position_ids": torch.stack(got["pos"]),
        "step_valid": torch.arange(T1)[None, :] < (T1 - torch.arange(S))[:, None],
        "logits": logits,
        "step0_targets": got["targets"][0],
    }
    same = all(torch.equal(logits[s].argmax(-1), draft_tokens[s][0]) for s in range(S))
    return ref, {"argmax_of_captured_logits_equals_draft_tokens": same}


def peagle_reference(
    model: nn.Module, batch: dict[str, Tensor]
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """All rows of one seeded COD batch of the library's forward, and one full rollout."""
    import speculators.models.peagle.core as peagle_core
    import torch

    K = PARAMS["num_depths"]
    rec: dict[str, Any] = {}
    got: dict[str, Any] = {}
    spec = [
        (model.lm_head, lambda m, a, o: got.__setitem__("logits", o.detach().clone())),
        (model.embed_tokens, lambda m, a, o: got.__setitem__("ids", a[0][0].detach().clone())),
        (model.rotary_emb, lambda m, a, o: got.__setitem__("pos", a[1][0].detach().clone())),
        (model.verifier_lm_head, lambda m, a, o: got.__setitem__("targets", o[0].detach().clone())),
    ]
    kwargs = _forward_kwargs(
        model, num_depths=K, down_sample_ratio=0.7, down_sample_ratio_min=0.2, max_anchors=None
    )

    def record(args: tuple, kw: dict, out: Any) -> None:
        rec["anchor"], rec["depth"] = out[0].clone(), out[1].clone()

    torch.manual_seed(PARAMS["seed"] + COD_SEED)  # COD sampling draws from the global generator
    with (
        torch.no_grad(),
        _hooks(spec),
        _wrapped(peagle_core, "generate_cod_sample_indices", record),
    ):
        model(**batch, **kwargs)
    anchor, depth = rec["anchor"], rec["depth"]
    full = [
        a
        for a in anchor[depth == 0].tolist()
        if all(((anchor == a) & (depth == d)).any() for d in range(K))
    ]
    if not full:
        raise SpecUIError(
            "the seeded COD batch has no anchor with rows at every depth; change COD_SEED"
        )
    want = PARAMS["peagle_anchor"]
    a = min(
        full, key=lambda x: (abs(x - want), x)
    )  # the configured anchor when it has a full chain
    rows = torch.tensor([int(((anchor == a) & (depth == d)).nonzero()[0]) for d in range(K)])
    logits, targets = got["logits"], got["targets"]
    ref = {
        **batch,
        "row_anchor_pos": anchor,
        "row_depth": depth,
        "row_position_ids": got["pos"],
        "row_input_ids": got["ids"],
        "logits": logits,
        "chain_anchor": torch.tensor([a]),
        "chain_row_indices": rows,
        "chain_logits": logits[0, rows],
        "chain_targets": targets[a : a + K],
    }
    # A rollout must not depend on the other rollouts of the batch: rerun with only the
    # depth-0 rows plus this chain.
    T1 = batch["input_ids"].shape[1]
    only = (
        torch.cat([torch.arange(T1), torch.full((K - 1,), a)]),
        torch.cat([torch.zeros(T1, dtype=torch.long), torch.arange(1, K)]),
    )
    with (
        torch.no_grad(),
        _hooks(spec[:1]),
        _replaced(peagle_core, "generate_cod_sample_indices", lambda original: lambda **kw: only),
    ):
        model(**batch, **kwargs)
    alone = got["logits"][0, [a, *range(T1, T1 + K - 1)]]
    checks = {
        "chain logits: full COD batch vs depth0+chain-only batch (max abs diff)": _max_diff(
            alone, ref["chain_logits"]
        ),
        "chosen anchor": a,
        "rows per depth": [int((depth == d).sum()) for d in range(K)],
    }
    return ref, checks


def dflash_prefix_sanity(
    model: nn.Module, verifier: nn.Module, ids: Tensor, block_logits: Tensor
) -> dict[str, float]:
    """Block logits must depend only on the tokens before the anchor and the anchor token itself.

    The verifier is re-run on modified sequences (real hidden states, not patched
    tensors); a change after the anchor must leave the block bit-identical, a change
    at or before the anchor must not.
    """
    import torch

    p, B, V, T = PARAMS["dflash_anchor"], PARAMS["block_size"], PARAMS["vocab"], PARAMS["seq_len"]
    g = torch.Generator().manual_seed(PARAMS["seed"] + SANITY_SEED)
    base_taps = verifier_taps(verifier, ids)[0]
    loss_mask = torch.zeros(T, dtype=torch.long)
    loss_mask[p] = 1

    def changed(positions: list[int]) -> tuple[float, Tensor]:
        x = ids.clone()
        idx = torch.tensor(positions)
        x[idx] = (x[idx] + torch.randint(1, V - 1, (len(positions),), generator=g)) % (
            V - 1
        )  # always different
        taps = verifier_taps(verifier, x)[0]
        batch = collate(raw_sample(taps, x, loss_mask.clone()), shifted=False)
        with torch.no_grad():
            logits = model._backbone_forward(
                **{k: batch[k] for k in BATCH_KEYS},
                max_anchors=1,
            )[1]
        return _max_diff(logits, block_logits), taps

    out: dict[str, float] = {}
    diff, taps = changed(list(range(p + B, T)))
    out["change tokens after the block (pos >= p+B)"] = diff
    out["  (verifier taps at pos < p identical)"] = _max_diff(taps[:, :p], base_taps[:, :p])
    out["  (verifier taps at pos >= p+B differ by)"] = _max_diff(
        taps[:, p + B :], base_taps[:, p + B :]
    )
    out["change tokens p+1..T-1 (inside block after anchor + after block)"] = changed(
        list(range(p + 1, T))
    )[0]
    out["control: change anchor token x[p]"] = changed([p])[0]
    out["control: change context token x[p-1]"] = changed([p - 1])[0]
    out["control: change context token x[0]"] = changed([0])[0]
    return out


# ------------------------------------------------------------------- independent re-implementation
# Plain torch, from the files on disk only (config.json, model.safetensors, the verifier's
# weights, the reference inputs): the math each REFERENCE.md documents.  It shares no
# code with the library, so a reference that the library computed differently from
# its documentation shows up here.


def _rms(x: Tensor, w: Tensor, eps: float) -> Tensor:
    import torch

    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x: Tensor, pos: Tensor, theta: float) -> Tensor:
    """HF 'default' rotary embedding of x [heads, N, d] at integer positions pos [N]."""
    import torch

    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin


def _lin(x: Tensor, w: dict[str, Tensor], name: str) -> Tensor:
    y = x @ w[f"{name}.weight"].T
    return y + w[f"{name}.bias"] if f"{name}.bias" in w else y


class _Dims:
    def __init__(self, tl: dict[str, Any]) -> None:
        self.heads, self.kv = tl["num_attention_heads"], tl["num_key_value_heads"]
        self.d = tl.get("head_dim") or tl["hidden_size"] // self.heads
        self.eps, self.theta = tl["rms_norm_eps"], tl["rope_parameters"]["rope_theta"]
        if any(t != "full_attention" for t in tl.get("layer_types") or []):
            raise SpecUIError("the self-check implements full-attention draft layers only")


def _attention(
    w: dict[str, Tensor],
    pre: str,
    xq: Tensor,
    xkv: Tensor,
    pq: Tensor,
    pkv: Tensor,
    visible: Tensor,
    c: _Dims,
) -> Tensor:
    """o_proj(softmax(q k^T / sqrt(d) over visible keys) v); q/k RMS-normed per head when the layer
    has norms."""
    import torch

    q = _lin(xq, w, f"{pre}.q_proj").view(len(xq), c.heads, c.d).transpose(0, 1)
    k = _lin(xkv, w, f"{pre}.k_proj").view(len(xkv), c.kv, c.d).transpose(0, 1)
    v = _lin(xkv, w, f"{pre}.v_proj").view(len(xkv), c.kv, c.d).transpose(0, 1)
    if f"{pre}.q_norm.weight" in w:
        q, k = _rms(q, w[f"{pre}.q_norm.weight"], c.eps), _rms(k, w[f"{pre}.k_norm.weight"], c.eps)
    q, k = _rope(q, pq, c.theta), _rope(k, pkv, c.theta)
    k, v = k.repeat_interleave(c.heads // c.kv, 0), v.repeat_interleave(c.heads // c.kv, 0)
    s = (q @ k.transpose(-1, -2)) * c.d**-0.5
    a = torch.softmax(s.masked_fill(~visible, float("-inf")).float(), -1) @ v
    return _lin(a.transpose(0, 1).reshape(len(xq), -1), w, f"{pre}.o_proj")


def _mlp(w: dict[str, Tensor], pre: str, x: Tensor) -> Tensor:
    import torch

    return _lin(
        torch.nn.functional.silu(_lin(x, w, f"{pre}.gate_proj")) * _lin(x, w, f"{pre}.up_proj"),
        w,
        f"{pre}.down_proj",
    )


def _verifier_math(
    vw: dict[str, Tensor], vcfg: dict[str, Any], ids: Tensor
) -> tuple[Tensor, Tensor]:
    import torch

    c = _Dims(vcfg)
    h = vw["model.embed_tokens.weight"][ids]
    T = len(ids)
    pos, causal = torch.arange(T), torch.ones(T, T, dtype=torch.bool).tril()
    taps = [h]
    for i in range(vcfg["num_hidden_layers"]):
        pre = f"model.layers.{i}"
        a = _rms(h, vw[f"{pre}.input_layernorm.weight"], c.eps)
        h = h + _attention(vw, f"{pre}.self_attn", a, a, pos, pos, causal, c)
        h = h + _mlp(vw, f"{pre}.mlp", _rms(h, vw[f"{pre}.post_attention_layernorm.weight"], c.eps))
        taps.append(h)
    return torch.stack(taps), _rms(h, vw["model.norm.weight"], c.eps) @ vw["lm_head.weight"].T


def _verifier_logits_from_last(vw: dict[str, Tensor], eps: float, last: Tensor) -> Tensor:
    return _rms(last, vw["model.norm.weight"], eps) @ vw["lm_head.weight"].T


def _dflash_math(
    cfg: dict[str, Any], w: dict[str, Tensor], vw: dict[str, Tensor], ref: dict[str, Tensor]
) -> dict[str, Tensor]:
    import torch

    tl, c = cfg["transformer_layer_config"], _Dims(cfg["transformer_layer_config"])
    B, m, sfa = cfg["block_size"], cfg["mask_token_id"], cfg["sample_from_anchor"]
    x, G = ref["input_ids"][0], ref["hidden_states"][0]
    p, T = int(ref["anchor_position"][0]), len(x)
    ctx = _rms(G @ w["fc.weight"].T, w["hidden_norm.weight"], c.eps)  # computed once, never updated
    h = vw["model.embed_tokens.weight"][torch.tensor([int(x[p])] + [m] * (B - 1))]
    pos_blk, pos_ctx = p + torch.arange(B), ref["position_ids"][0]
    visible = torch.cat(
        [(torch.arange(T) < p)[None].expand(B, T), torch.ones(B, B, dtype=torch.bool)], 1
    )
    for i in range(tl["num_hidden_layers"]):
        pre = f"layers.{i}"
        a = _rms(h, w[f"{pre}.input_layernorm.weight"], c.eps)
        h = h + _attention(
            w,
            f"{pre}.self_attn",
            a,
            torch.cat([ctx, a]),
            pos_blk,
            torch.cat([pos_ctx, pos_blk]),
            visible,
            c,
        )
        h = h + _mlp(w, f"{pre}.mlp", _rms(h, w[f"{pre}.post_attention_layernorm.weight"], c.eps))
    hidden = _rms(h, w["norm.weight"], c.eps)
    logits = (
        hidden @ w.get("lm_head.weight", vw["lm_head.weight"]).T
    )  # full vocab: the verifier's head
    tgt = torch.arange(p, p + B) - (0 if sfa else 1)
    out = {
        "block_logits": logits[None],
        "block_targets": _verifier_logits_from_last(
            vw, c.eps, ref["verifier_last_hidden_states"][0, tgt]
        )[None],
    }
    if "markov_head.markov_w1.weight" in w:
        if cfg.get("markov_head_type", "vanilla") != "vanilla":
            raise SpecUIError("the self-check implements the vanilla Markov head only")
        blk = x[p : p + B]
        prev = blk if sfa else torch.cat([blk[:1], blk[:-1]])
        e = w["markov_head.markov_w1.weight"][prev]
        out["markov_logits"] = (logits + e @ w["markov_head.markov_w2.weight"].T)[None]
        feats = (
            torch.cat([hidden, e], -1) if cfg.get("confidence_head_with_markov", True) else hidden
        )
        out["confidence_logits"] = _lin(feats, w, "confidence_head.proj").squeeze(-1)[None]
    return out


def _first_layer(
    w: dict[str, Tensor], e: Tensor, g: Tensor, nbr: bool, c: _Dims
) -> tuple[Tensor, Tensor]:
    """EAGLE first-layer input: (cat[input_ln(embed), hidden_norm(g)], residual)."""
    import torch

    hn = _rms(g, w["layers.0.hidden_norm.weight"], c.eps)
    return torch.cat([_rms(e, w["layers.0.input_layernorm.weight"], c.eps), hn], -1), (
        hn if nbr else g
    )


def _eagle_layers(
    w: dict[str, Tensor],
    cfg: dict[str, Any],
    e: Tensor,
    g: Tensor,
    pq: Tensor,
    keys: list,
    visible: Tensor,
    c: _Dims,
) -> Tensor:
    """The draft layers on one set of query rows; ``keys[i]`` caches layer i's (inputs, positions)
    of earlier rows."""
    import torch

    u, h = _first_layer(w, e, g, cfg["norm_before_residual"], c)
    for i in range(cfg["transformer_layer_config"]["num_hidden_layers"]):
        pre = f"layers.{i}"
        a = u if i == 0 else _rms(h, w[f"{pre}.input_layernorm.weight"], c.eps)
        keys[i].append((a, pq))
        kv, pkv = torch.cat([k for k, _ in keys[i]]), torch.cat([q for _, q in keys[i]])
        h = h + _attention(w, f"{pre}.self_attn", a, kv, pq, pkv, visible, c)
        h = h + _mlp(w, f"{pre}.mlp", _rms(h, w[f"{pre}.post_attention_layernorm.weight"], c.eps))
    return h


def _eagle3_math(
    cfg: dict[str, Any], w: dict[str, Tensor], vw: dict[str, Tensor], ref: dict[str, Tensor]
) -> dict[str, Tensor]:
    import torch

    c = _Dims(cfg["transformer_layer_config"])
    G = ref["hidden_states"][0]
    if "input_norm.weight" in w:
        G = _rms(G, w["input_norm.weight"], c.eps)
    g = G @ w["fc.weight"].T
    S, T1 = ref["step_input_ids"].shape
    keys: list[list] = [[] for _ in range(cfg["transformer_layer_config"]["num_hidden_layers"])]
    idx = torch.arange(T1)
    logits = []
    for s in range(S):
        # Step-0 keys causally, then only the same index of every later step so far.
        vis = [idx[None, :] <= idx[:, None]] + [idx[None, :] == idx[:, None]] * s
        h = _eagle_layers(
            w,
            cfg,
            w["embed_tokens.weight"][ref["step_input_ids"][s]],
            g,
            ref["position_ids"][0] + s,
            keys,
            torch.cat(vis, 1),
            c,
        )
        if cfg["norm_output"]:
            h = _rms(h, w["norm.weight"], c.eps)
            logits.append(h @ w["lm_head.weight"].T)
        else:
            logits.append(_rms(h, w["norm.weight"], c.eps) @ w["lm_head.weight"].T)
        g = h
    return {
        "logits": torch.stack(logits),
        "step0_targets": _verifier_logits_from_last(
            vw, c.eps, ref["verifier_last_hidden_states"][0]
        )[None],
    }


def _peagle_math(
    cfg: dict[str, Any], w: dict[str, Tensor], vw: dict[str, Tensor], ref: dict[str, Tensor]
) -> dict[str, Tensor]:
    import torch

    c = _Dims(cfg["transformer_layer_config"])
    a, d = ref["row_anchor_pos"], ref["row_depth"]
    q = a + d
    tok = torch.where(d == 0, ref["input_ids"][0, q], torch.tensor(cfg["mask_token_id"]))
    g = torch.where((d == 0)[:, None], ref["hidden_states"][0, q], w["mask_hidden"].reshape(1, -1))
    if "input_norm.weight" in w:
        g = _rms(g, w["input_norm.weight"], c.eps)
    visible = ((d[None, :] == 0) & (a[None, :] <= a[:, None])) | (
        (a[None, :] == a[:, None]) & (d[None, :] <= d[:, None])
    )
    keys: list[list] = [[] for _ in range(cfg["transformer_layer_config"]["num_hidden_layers"])]
    h = _eagle_layers(
        w, cfg, w["embed_tokens.weight"][tok], g @ w["fc.weight"].T, q, keys, visible, c
    )
    logits = _rms(h, w["norm.weight"], c.eps) @ w["lm_head.weight"].T
    K, an = len(ref["chain_row_indices"]), int(ref["chain_anchor"][0])
    targets = _verifier_logits_from_last(
        vw, c.eps, ref["verifier_last_hidden_states"][0, an : an + K]
    )
    return {
        "logits_all_rows": logits[None],
        "chain_logits": logits[ref["chain_row_indices"]],
        "chain_targets": targets,
    }


def self_check(folder: Path) -> dict[str, float]:
    """Max |independent plain-torch result - reference| per documented tensor of a fixture set."""
    import torch
    from safetensors.torch import load_file

    vdir = folder / "verifier"
    vcfg = json.loads((vdir / "config.json").read_text())
    vw, vref = load_file(vdir / "model.safetensors"), load_file(vdir / "reference.safetensors")
    taps, logits = _verifier_math(vw, vcfg, vref["input_ids"])
    out = {
        "verifier.taps": _max_diff(taps, vref["taps"]),
        "verifier.logits": _max_diff(logits, vref["logits"]),
    }
    N = vcfg["num_hidden_layers"]
    for algo in ALGOS:
        cfg = json.loads((folder / algo / "config.json").read_text())
        w, ref = (
            load_file(folder / algo / "model.safetensors"),
            load_file(folder / algo / "reference.safetensors"),
        )
        # The sample must be the verifier's own taps, in the layout REFERENCE.md gives.
        aux = cfg.get("aux_hidden_state_layer_ids") or cfg["eagle_aux_hidden_state_layer_ids"]
        feats = torch.cat([vref["taps"][i] for i in aux], -1)
        shift = 1 if algo in ("eagle3", "peagle") else 0
        T = feats.shape[0] - shift
        out[f"{algo}.inputs"] = max(
            _max_diff(ref["hidden_states"][0], feats[:T]),
            _max_diff(ref["verifier_last_hidden_states"][0], vref["taps"][N][shift:]),
            _max_diff(ref["input_ids"][0], vref["input_ids"][shift:]),
        )
        if algo in ("dflash", "dspark"):
            got = _dflash_math(cfg, w, vw, ref)
        elif algo == "eagle3":
            got = _eagle3_math(cfg, w, vw, ref)
            steps = range(len(got["logits"]))  # one entry per TTT step
            got = {
                "step0_targets": got["step0_targets"],
                **{f"logits_step{s}": got["logits"][s] for s in steps},
            }
            ref = {**ref, **{f"logits_step{s}": ref["logits"][s] for s in steps}}
        else:
            got = _peagle_math(cfg, w, vw, ref)
            ref = {**ref, "logits_all_rows": ref["logits"]}
        for name, value in got.items():
            out[f"{algo}.{name}"] = _max_diff(value, ref[name])
    return out


# --------------------------------------------------------------------------- documents


TAPS_DOC = """\
### Verifier taps (hidden-state layer ids)

`tap[L]` is the verifier's residual stream after `L` decoder layers -- the value
vLLM stores for hidden-state layer id `L`:

* `tap[0]`: the token embeddings;
* `tap[L]`, `0 < L < N`: the output of decoder layer `L-1` (equal to HF `output_hidden_states[L]`);
* `tap[N]` (`N` = verifier layers): the output of the last decoder layer, **before**
  the final `model.norm`.  HF's `output_hidden_states[N]` is the value *after* that
  norm; it is not a tap.

A training sample is `hidden_states = cat([tap[l] for l in aux ids], -1)` (ids in
ascending order, as vLLM captures them) and `verifier_last_hidden_states = tap[N]`.
The library builds its targets itself as `verifier_lm_head(verifier_norm(tap[N][t]))`,
the verifier logits at `t` (which predict token `t+1`).
"""

NOTATION_DOC = """\
Notation: `RMSNorm_w(x) = w * x / sqrt(mean(x^2) + eps)` in float32 (eps =
`rms_norm_eps`); Linear layers have no bias unless the checkpoint has one;
`MLP(x) = down(silu(gate(x)) * up(x))`; RoPE is HF's "default" rotary embedding,
`inv_freq[i] = theta^(-2i/head_dim)`, `x*cos + rotate_half(x)*sin` with
`rotate_half(x) = [-x2, x1]` (the two halves of the head dim); attention is GQA
(kv heads repeated), scaled by `head_dim^-0.5`, softmax in float32 over the
visible keys (the others get `-inf`).
"""


def _meaning(algo: str) -> dict[str, str]:
    p = PARAMS
    a = p["dflash_anchor"]
    common = {
        "hidden_states": "concatenated aux verifier taps (see 'Verifier taps')",
        "verifier_last_hidden_states": "tap[N], the last decoder layer output before the "
        "verifier's final norm",
        "document_ids": "document ids (all 0: one document, no padding)",
    }
    if algo in ("dflash", "dspark"):
        sfa = algo == "dspark"
        return {
            **common,
            "input_ids": "[1,T] token ids x[0..T-1] (no shift for the DFlash family)",
            "loss_mask": f"[1,T] 1 only at position {a}, so the library's anchor choice has one "
            "candidate",
            "position_ids": "[1,T] arange(T), as the trainer passes them",
            "anchor_position": f"the single anchor p = {a}",
            "block_input_ids": "the block's input tokens [x[p], m, ..., m] (m = mask_token_id)",
            "block_position_ids": "RoPE positions of the block slots, p + k",
            "block_predicted_positions": "position of the token slot k predicts: "
            + (
                "p+k+1 (sample_from_anchor)"
                if sfa
                else "p+k (slot 0 is the anchor itself, not trained)"
            ),
            "fc_output": "[1,T,H] hidden_norm(fc(hidden_states)), the draft context C (only C[:p] "
            "is visible)",
            "block_layer_outputs": "[layers,B,H] block states after each draft layer (before the "
            "final norm)",
            "block_hidden": "[1,B,H] norm(last layer output)",
            "block_logits": "[1,B,V] lm_head(block_hidden), the `_backbone_forward` logits"
            + (" (before the Markov bias)" if sfa else ""),
            "block_targets": "[1,B,V] the verifier logits the library aligns with each slot",
            "block_loss_mask": "[1,B] the library's loss mask for the block (informational)",
            "markov_prev_token_ids": "[B] the previous token of slot k fed to the Markov / "
            "confidence heads (x[p+k])",
            "markov_bias": "[1,B,V] markov_w2(markov_w1[prev_k])",
            "markov_logits": "[1,B,V] block_logits + markov_bias: the DSpark draft distribution",
            "confidence_logits": "[1,B] confidence_head.proj(cat[block_hidden_k, "
            "markov_w1[prev_k]]), pre-sigmoid",
        }
    if algo == "eagle3":
        return {
            **common,
            "input_ids": "[1,T'] shifted ids: input_ids[i] = x[i+1] (T' = T-1, `shift_batch`)",
            "hidden_states": "[1,T',k*H] hidden_states[i] = cat_l tap[l][i] (the verifier state "
            "at ORIGINAL position i)",
            "verifier_last_hidden_states": "[1,T',H] tap[N][i+1]",
            "loss_mask": "[1,T'] ones",
            "position_ids": "[1,T'] i+1, as the trainer passes them",
            "step_input_ids": "[S,T'] token fed at TTT step s, index i: x[i+1+s] (teacher "
            "forcing; 0 past the end)",
            "step_position_ids": "[S,T'] RoPE position at step s: i+1+s",
            "step_valid": "[S,T'] i < T'-s (later rows are padding, outside the loss)",
            "logits": "[S,T',V] draft logits of step s at index i; they predict x[i+s+2]",
            "step0_targets": "[1,T',V] verifier logits at original position i+1 (step s uses "
            "index i+s)",
        }
    return {
        **common,
        "input_ids": "[1,T'] shifted ids: input_ids[j] = x[j+1]",
        "hidden_states": "[1,T',k*H] hidden_states[j] = cat_l tap[l][j] (ORIGINAL position j)",
        "verifier_last_hidden_states": "[1,T',H] tap[N][j+1]",
        "loss_mask": "[1,T'] ones",
        "position_ids": "[1,T'] j+1 as the trainer passes them; P-EAGLE's forward ignores them",
        "row_anchor_pos": "[R] anchor (shifted index) of each draft row; rows 0..T'-1 are depth "
        "0, anchor j",
        "row_depth": "[R] depth d of each row",
        "row_position_ids": "[R] a+d: the RoPE position and the shifted index of the row's target",
        "row_input_ids": "[R] token of each row: x[a+1] at depth 0, mask_token_id deeper",
        "logits": "[1,R,V] draft logits of every row of the seeded COD batch",
        "chain_anchor": "anchor a whose rollout has rows at every depth",
        "chain_row_indices": "[K] row indices of (a,0), (a,1), ..., (a,K-1)",
        "chain_logits": "[K,V] logits of that rollout; depth d predicts x[a+d+2]",
        "chain_targets": "[K,V] verifier logits at original positions a+1..a+K",
    }


def _table(tensors: dict[str, Tensor], meaning: dict[str, str]) -> str:
    rows = ["| name | dtype | shape | meaning |", "|---|---|---|---|"]
    for name in sorted(tensors):
        t = tensors[name]
        dtype = str(t.dtype).replace("torch.", "")
        rows.append(f"| `{name}` | {dtype} | {list(t.shape)} | {meaning.get(name, '')} |")
    return "\n".join(rows)


def _math(algo: str, cfg: dict[str, Any]) -> str:
    if algo in ("dflash", "dspark"):
        text = """\
With anchor `p`, block size `B` and `G = hidden_states`:

1. Context `C = RMSNorm_hidden_norm(fc(G))`, `[T,H]`, computed once; the draft layers
   read it as keys/values and never update or re-normalise it.
2. Block input: tokens `[x[p], m, ..., m]`, embedded with the frozen verifier embedding.
3. Positions: context key `j` at `position_ids[j]`, block slot `k` at `p + k`.
4. Each draft layer (Qwen3 style): `a = input_layernorm(h)`; queries `q_norm(q_proj(a))`
   per head at `p+k`; keys `k_norm(k_proj([C; a]))` per kv head at `[positions; p..p+B-1]`;
   values `v_proj([C; a])`; a block query sees context key `j` iff `j < p` (same
   document) and every slot of its own block (full-attention layers are bidirectional);
   `h = h + o_proj(attn)`, `h = h + MLP(post_attention_layernorm(h))`.
5. `block_hidden = norm(h)`, `block_logits = lm_head(block_hidden)`; a full-vocabulary
   draft uses the verifier's `lm_head` (not saved in model.safetensors).
6. Targets: the verifier logits at `p+k-1` (sample_from_anchor False: slot 0 would
   predict the anchor and is masked) or at `p+k` (sample_from_anchor True).
"""
        if algo == "dspark":
            text += f"""\
7. DSpark heads (vanilla Markov head, rank {cfg["markov_rank"]}): `e_k = markov_w1[prev_k]`
   with `prev_k = x[p+k]`; `markov_logits_k = block_logits_k + markov_w2(e_k)`;
   `confidence_logit_k = proj(cat[block_hidden_k, e_k]) + bias`.  At inference `prev_k`
   is the token drafted for slot `k-1` (slot 0: the anchor token).
"""
        return text
    if algo == "eagle3":
        return """\
Index `i` (0..T'-1) stands for original position `i+1`.

* `g^(0) = fc(input_norm(hidden_states))` (`input_norm`: one RMSNorm over the whole
  concatenation, present because norm_before_fc is set).
* TTT step `s`: `e = embed_tokens(step_input_ids[s])`; the first layer feeds
  `u = cat[input_layernorm(e), hidden_norm(g^(s))]` to q/k/v (2H wide) and keeps
  `hidden_norm(g^(s))` as the residual (norm_before_residual); RoPE at `i+1+s`; every
  step's keys/values are cached; query `(s,i)` sees the step-0 keys `j <= i` and the
  keys `(s',i)` of its own index for `1 <= s' <= s`; then
  `h = residual + o_proj(attn)`, `h = h + MLP(post_attention_layernorm(h))` (Llama layer).
* norm_output: `h = norm(h)`, `logits[s] = lm_head(h)`, and `g^(s+1) = h` (the normed value).
* `embed_tokens` / `lm_head` are frozen copies of the verifier's but are saved in
  model.safetensors for EAGLE-3.  Steps >= 1 are teacher-forced with `x[i+1+s]`.
"""
    return """\
Shifted index `j` stands for original position `j+1`; row `r` has anchor `a`, depth `d`, `q = a + \
d`.

* Input token `x[q+1]` (= `input_ids[q]`) at depth 0, `mask_token_id` deeper; hidden
  `hidden_states[q]` at depth 0, the learned `mask_hidden` deeper.
* `u = cat[embed_tokens(token), fc(hidden)]` with P-EAGLE's own (trained, saved)
  embedding; the first layer normalises the halves (`input_layernorm`, `hidden_norm`)
  for q/k/v (Qwen3: q_norm/k_norm per head), residual `hidden_norm(fc(hidden))`; later
  layers are plain Qwen3 layers; `logits = lm_head(norm(h))`.
* RoPE position `q = a + d` (the shifted index; RoPE is relative, so only differences matter).
* Row `(a,d)` sees every depth-0 row `j <= a` and the rows `(a,d')`, `d' <= d`, of its
  own rollout (same document), nothing else.
* Row `(a,d)` predicts `x[a+d+2]`; its target is the verifier logits at original
  position `a+d+1`.  Depths >= 1 are sampled at random by the library
  (`generate_cod_sample_indices`); the rows drawn are saved, so no RNG has to be replayed.
"""


def _slots(cfg: dict[str, Any], ref: dict[str, Tensor]) -> str:
    """The DFlash-family slot table, read off the reference tensors."""
    sfa, m = cfg["sample_from_anchor"], cfg["mask_token_id"]
    rows = [
        "| slot k | input token | RoPE position | predicts | target = verifier logits at position "
        "|",
        "|---|---|---|---|---|",
    ]
    for k, (tok, pos, pred) in enumerate(
        zip(
            ref["block_input_ids"].tolist(),
            ref["block_position_ids"].tolist(),
            ref["block_predicted_positions"].tolist(),
            strict=True,
        )
    ):
        note = "" if sfa or k else " (the anchor itself: masked, unused)"
        rows.append(
            f"| {k} | {'mask' if tok == m else f'x[{pos}]'} | {pos} | x[{pred}]{note} | "
            f"{pos - (0 if sfa else 1)} |"
        )
    return "\n".join(rows)


def write_reference_doc(
    folder: Path,
    algo: str,
    cfg: dict[str, Any],
    tensors: dict[str, Tensor],
    weights: dict[str, Tensor],
    frozen: list[str],
    checks: dict[str, Any],
    versions: dict[str, str],
    sanity: dict[str, float],
) -> None:
    p = PARAMS
    tl = cfg["transformer_layer_config"]
    flags = ", ".join(
        f"{k} = {cfg[k]}"
        for k in (
            "sample_from_anchor",
            "norm_before_fc",
            "norm_before_residual",
            "norm_output",
            "fc_norm",
            "embed_requires_grad",
        )
        if k in cfg
    )
    chain = checks.get("chain logits: full COD batch vs depth0+chain-only batch (max abs diff)", 0)
    how = {
        "dflash": "`model._backbone_forward(..., max_anchors=1)`: the anchor sampler drops the "
        "last `B` "
        "positions and draws among `loss_mask == 1`, so with one candidate the anchor is fixed.",
        "eagle3": f"`model.forward(**batch, ttt_steps={p['ttt_steps']})`; a hook on `lm_head` "
        "records each "
        "step's logits (their argmax equals the returned draft tokens).",
        "peagle": f"`model.forward(**batch, num_depths={p['num_depths']}, down_sample_ratio=0.7, "
        f"down_sample_ratio_min=0.2)` after `torch.manual_seed({p['seed'] + COD_SEED})`; the COD "
        "sampler's output is recorded and `lm_head` hooked.  Rows per depth: "
        f"{checks.get('rows per depth')}; rerunning with only the depth-0 rows plus the chosen "
        f"rollout changes its logits by {chain:.3g}.",
    }
    how["dspark"] = how["dflash"] + (
        " Then `model.forward(..., max_anchors=1)` with the DSpark `compute_metrics` wrapped "
        "(recording only) for the Markov and confidence logits; recomputing both by hand from "
        f"`block_hidden` differs by {checks.get('markov_logits_forward_vs_manual', 0):.3g} / "
        f"{checks.get('confidence_forward_vs_manual', 0):.3g}."
    )
    layout = (
        "`CollateFn` with `shift_batch`"
        if algo in ("eagle3", "peagle")
        else "`CollateFn` (no shift)"
    )
    keys = ", ".join(f"`{k}` {list(v.shape)}" for k, v in sorted(weights.items()))
    extra = ""
    if algo in ("dflash", "dspark"):
        extra = (
            f"\n### Slots (sample_from_anchor = {cfg['sample_from_anchor']})\n\n"
            f"{_slots(cfg, tensors)}\n"
        )
    if sanity:
        extra += (
            "\n### Sanity check: the block depends only on the prefix (< p) and the anchor "
            "token\n\nThe verifier was re-run on modified sequences and the block recomputed by "
            "the library; max abs diff of `block_logits` (the magnitudes depend on the "
            "replacement tokens drawn):\n\n| modification | max abs diff |\n|---|---|\n"
            + "".join(f"| {k.strip()} | {v:.3g} |\n" for k, v in sanity.items())
        )
    text = f"""# {algo} reference (speculators {SPECULATORS_VERSION})

Written by `scripts/make_fixtures.py`; float32, CPU, eager attention, batch 1.
V = {p["vocab"]}, H = {p["hidden"]}, T = {p["seq_len"]}, aux_hidden_state_layer_ids = \
{p["aux_ids"]},
draft: {tl["num_hidden_layers"]} `{tl["model_type"]}` layer(s), layer_types {tl.get("layer_types")}.
Flags: {flags}.

## How it was produced

1. The verifier (`../verifier`) ran on the fixed token sequence; its taps were laid
   out by the library's `BaseDataset.__getitem__` and {layout}.
2. The draft was reloaded with `SpeculatorModel.from_pretrained` (verifier: the sibling
   `verifier/`, `transformer_layer_config._attn_implementation = "eager"`).
3. {how[algo]}

## Tensors in `reference.safetensors`

{_table(tensors, _meaning(algo))}

{TAPS_DOC}
## Math (what an independent implementation must do)

{NOTATION_DOC}
{_math(algo, cfg)}{extra}
## Checkpoint

`model.safetensors` keys: {keys}.

Trainable parameters randomised (seed {p["seed"] + DRAFT_SEEDS[algo]}, in `named_parameters()` \
order):
Linear weights `N(0, 1/fan_in)`, RMSNorm gains `1 + 0.2 N(0,1)`, embeddings / `markov_w1` /
`mask_hidden` `N(0,1)`, biases `0.1 N(0,1)`.  Frozen, verifier-owned (set by the library's
`load_verifier_weights`): {", ".join(f"`{n}`" for n in frozen)}.
Removed after `save_pretrained`: {REMOVED_AFTER_SAVE} (library source; config.json keeps its
`auto_map`).  `speculators_config.verifier.name_or_path` records where the verifier lay when
the set was written; do not rely on it, use the sibling `verifier/`.

Versions: {json.dumps(versions)}.
"""
    (folder / "REFERENCE.md").write_text(text)


def write_verifier_doc(folder: Path, tensors: dict[str, Tensor], versions: dict[str, str]) -> None:
    p = PARAMS
    meaning = {
        "input_ids": f"[T] the fixed token sequence x (T = {p['seq_len']}), uniform in [0, V-2] "
        "(never the mask id V-1)",
        "taps": "[N+1,T,H] tap[L] = residual stream after L decoder layers; tap[N] is before the "
        "final norm",
        "hf_last_hidden_state": "[T,H] HF `output_hidden_states[N]` = model.norm(tap[N]) (for "
        "comparison only)",
        "logits": "[T,V] verifier logits; logits[t] predicts x[t+1]",
    }
    text = f"""# verifier reference

Tiny random `Qwen3ForCausalLM` (transformers {versions["transformers"]}): vocab {p["vocab"]}, \
hidden {p["hidden"]},
{p["layers"]} layers, {p["heads"]} heads / {p["kv_heads"]} kv heads, head_dim {p["head_dim"]}, \
intermediate
{p["intermediate"]}, rope_theta {p["rope_theta"]}, untied embeddings, no tokenizer.  Weights: \
transformers' own
init after `torch.manual_seed({p["seed"]})` (initializer_range 0.1), then every RMSNorm gain
`1 + 0.2 N(0,1)` (generator seed {p["seed"] + NORM_GAIN_SEED}) so that a missing norm gain changes \
the
output.  Float32, eager attention.

{_table(tensors, meaning)}

{TAPS_DOC}"""
    (folder / "REFERENCE.md").write_text(text)


def write_readme(out: Path, versions: dict[str, str], self_diffs: dict[str, float]) -> None:
    listing = "\n".join(
        f"{str(f.relative_to(out)):<55} {f.stat().st_size:>9}"
        for f in sorted(out.rglob("*"))
        if f.is_file() and f.parent != out
    )
    text = f"""# speculators {SPECULATORS_VERSION} reference fixtures (public set)

Written by the `speculators` package {SPECULATORS_VERSION} (PyPI) itself, float32, on CPU, by
`scripts/make_fixtures.py` (which also documents what a regeneration reproduces exactly).

Every algorithm folder's verifier is the sibling folder `verifier/`.  The
`speculators_config.verifier.name_or_path` in each config.json only records where the
verifier lay when the set was written: pass `verifier/` explicitly.

Versions: {json.dumps(versions)}

`<algo>/REFERENCE.md` documents each folder's tensors and math, `verifier/REFERENCE.md`
the verifier taps.  All float32, CPU, eager attention: an independent float32
implementation should agree to ~1e-5..1e-4 (summation order).

Self-check (an independent plain-torch implementation of the documented math, fed only
the saved files; max abs diff vs the references):
`{json.dumps(self_diffs)}`.

```
{listing}
```
"""
    (out / "README.md").write_text(text)


# --------------------------------------------------------------------------- generation


def _save_tensors(path: Path, tensors: dict[str, Tensor], info: dict[str, str]) -> None:
    from safetensors.torch import save_file

    save_file(
        {k: v.detach().contiguous() for k, v in tensors.items()},
        str(path),
        metadata={"info": json.dumps(info, sort_keys=True)},
    )


def generate(out: Path) -> dict[str, Any]:
    """Write a complete fixture set into the empty folder ``out``; return its manifest."""
    import torch
    from safetensors.torch import load_file

    torch.set_num_threads(1)  # one thread: the same summation order on every machine
    p = PARAMS
    versions = _versions()
    info = {"set": "public", **versions}
    vdir = out / "verifier"
    print(f"make_fixtures: verifier -> {vdir}", flush=True)
    verifier = build_verifier(vdir)
    ids = fixed_tokens()
    taps, hf_last, logits = verifier_taps(verifier, ids)
    if _max_diff(hf_last, verifier.model.norm(taps[-1]).detach()) > 1e-6:
        raise SpecUIError(
            "tap[N] is not the pre-norm last hidden state; transformers changed its outputs"
        )
    vref = {"input_ids": ids, "taps": taps, "hf_last_hidden_state": hf_last, "logits": logits}
    _save_tensors(vdir / "reference.safetensors", vref, info)
    write_verifier_doc(vdir, vref, versions)

    checks: dict[str, Any] = {}
    sanity: dict[str, float] = {}
    for algo in ALGOS:
        folder = out / algo
        print(f"make_fixtures: {algo} -> {folder}", flush=True)
        model = build_draft(algo, vdir)
        frozen = randomise_trainable(model, p["seed"] + DRAFT_SEEDS[algo])
        model.save_pretrained(str(folder))
        for name in REMOVED_AFTER_SAVE:
            (folder / name).unlink(missing_ok=True)
        saved = load_file(folder / "model.safetensors")
        model = reload_draft(folder, vdir)
        state = model.state_dict()
        bad = [k for k in saved if not torch.equal(state[k], saved[k])]
        nan = [n for n, t in state.items() if t.is_floating_point() and t.isnan().any()]
        if bad or nan:
            raise SpecUIError(
                f"{algo}: reloaded model differs from the saved one ({bad}) or has NaN ({nan})"
            )
        if algo in ("dflash", "dspark"):
            lm = torch.zeros(p["seq_len"], dtype=torch.long)
            lm[p["dflash_anchor"]] = 1
            batch = collate(raw_sample(taps, ids, lm), shifted=False)
            ref, checks[algo] = dflash_family_reference(model, batch, algo)
            if algo == "dflash":
                sanity = dflash_prefix_sanity(model, verifier, ids, ref["block_logits"])
        else:
            batch = collate(
                raw_sample(taps, ids, torch.ones(p["seq_len"], dtype=torch.long)), shifted=True
            )
            ref, checks[algo] = (eagle3_reference if algo == "eagle3" else peagle_reference)(
                model, batch
            )
        _save_tensors(folder / "reference.safetensors", ref, {"algorithm": algo, **info})
        cfg = json.loads((folder / "config.json").read_text())
        write_reference_doc(
            folder,
            algo,
            cfg,
            ref,
            saved,
            frozen,
            checks[algo],
            versions,
            sanity if algo == "dflash" else {},
        )

    _enforce(checks, sanity)
    print("make_fixtures: self-check (independent plain-torch implementation)", flush=True)
    diffs = self_check(out)
    worst = max(diffs.values())
    if worst > SELF_CHECK_TOL:
        raise SpecUIError(
            f"self-check failed: max abs diff {worst:.3g} > {SELF_CHECK_TOL}: {diffs}"
        )
    write_readme(out, versions, diffs)
    files = {
        str(f.relative_to(out)): {"bytes": f.stat().st_size, "sha256": _sha256(f)}
        for f in sorted(out.rglob("*"))
        if f.is_file() and f.parent != out
    }
    total = sum(v["bytes"] for v in files.values())
    if total > p["size_limit_bytes"]:
        raise SpecUIError(f"the set is {total} bytes, over its limit of {p['size_limit_bytes']}")
    manifest = {
        "set": "public",
        "generator": "scripts/make_fixtures.py",
        "versions": versions,
        "config": p,
        "files": files,
        "checks": checks,
        "dflash_prefix_sanity": sanity,
        "independent_reimplementation_max_abs_diff": diffs,
        "reload_check": "SpeculatorModel.from_pretrained(dir) reloads every draft; all tensors "
        "equal to the "
        "saved model, no NaN",
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _enforce(checks: dict[str, Any], sanity: dict[str, float]) -> None:
    """Refuse a set whose library-side checks contradict what the REFERENCE.md files state."""
    bad = []
    if max(checks["dspark"].values()) > SELF_CHECK_TOL:
        bad.append(f"DSpark heads by hand differ from the library's forward: {checks['dspark']}")
    if not checks["eagle3"]["argmax_of_captured_logits_equals_draft_tokens"]:
        bad.append(
            "the EAGLE-3 logits captured from lm_head are not the ones the forward drafted from"
        )
    alone = checks["peagle"][
        "chain logits: full COD batch vs depth0+chain-only batch (max abs diff)"
    ]
    if alone > SELF_CHECK_TOL:
        bad.append(f"a P-EAGLE rollout depends on the other rollouts of its batch (by {alone:.3g})")
    after = [v for k, v in sanity.items() if k.startswith("change tokens") or "identical" in k]
    controls = [v for k, v in sanity.items() if k.startswith("control")]
    if max(after) > 0 or min(controls) < 1e-3:
        bad.append(
            f"DFlash block logits do not depend on exactly the prefix and the anchor: {sanity}"
        )
    if bad:
        raise SpecUIError("; ".join(bad))


# --------------------------------------------------------------------------- --check


def _volatile_free(cfg: dict[str, Any]) -> dict[str, Any]:
    """A config without the fields that legitimately differ between runs (see the module
    docstring)."""
    cfg = json.loads(json.dumps(cfg))
    cfg.pop("transformers_version", None)
    verifier = cfg.get("speculators_config", {}).get("verifier")
    if isinstance(verifier, dict):
        verifier.pop("name_or_path", None)
    return cfg


def compare(new: Path, old: Path, tol: float) -> list[str]:
    """Problems found comparing a fresh set with a committed one (printing the max diffs as it
    goes)."""
    import torch
    from safetensors.torch import load_file

    problems: list[str] = []
    old_manifest = json.loads((old / "manifest.json").read_text())
    new_manifest = json.loads((new / "manifest.json").read_text())
    if old_manifest.get("config") != new_manifest["config"]:
        problems.append(
            f"manifest config differs: {old_manifest.get('config')} vs {new_manifest['config']}"
        )
    names = sorted({str(f.relative_to(d)) for d in (new, old) for f in d.rglob("*") if f.is_file()})
    identical = 0
    for name in names:
        a, b = new / name, old / name
        if not (a.is_file() and b.is_file()):
            problems.append(f"{name}: only in the {'new' if a.is_file() else 'committed'} set")
            continue
        if a.read_bytes() == b.read_bytes():
            identical += 1
            print(f"  {name:<40} identical bytes")
            continue
        if name == "manifest.json":
            same = old_manifest.get("config") == new_manifest["config"]
            print(
                f"  {name:<40} config section "
                f"{'same' if same else 'DIFFERENT'}; "
                "versions / hashes / results not compared"
            )
        elif name.endswith(".json"):
            same = _volatile_free(json.loads(a.read_text())) == _volatile_free(
                json.loads(b.read_text())
            )
            print(
                f"  {name:<40} "
                f"{'same (up to name_or_path / transformers_version)' if same else 'DIFFERENT'}"
            )
            if not same:
                problems.append(f"{name}: configs differ")
        elif name.endswith(".safetensors"):
            ta, tb = load_file(a), load_file(b)
            if ta.keys() != tb.keys():
                problems.append(f"{name}: tensor names differ: {sorted(ta.keys() ^ tb.keys())}")
                continue
            worst, where = 0.0, ""
            for k in sorted(ta):
                if ta[k].dtype != tb[k].dtype or ta[k].shape != tb[k].shape:
                    problems.append(
                        f"{name}:{k}: {ta[k].dtype}{list(ta[k].shape)} vs "
                        f"{tb[k].dtype}{list(tb[k].shape)}"
                    )
                    continue
                exact = not ta[k].is_floating_point()
                d = (
                    0.0
                    if torch.equal(ta[k], tb[k])
                    else (float("inf") if exact else _max_diff(ta[k], tb[k]))
                )
                if d > worst:
                    worst, where = d, k
                if d > tol:
                    problems.append(f"{name}:{k}: max abs diff {d:.3g} > {tol}")
            print(
                f"  {name:<40} same names/dtypes/shapes; max abs diff "
                f"{worst:.3g}{f' ({where})' if where else ''}"
            )
        else:
            print(f"  {name:<40} differs (prose / versions: not compared)")
    print(f"  {identical}/{len(names)} files byte-identical")
    for label, folder in (("new", new), ("committed", old)):
        diffs = self_check(folder)
        worst_name = max(diffs, key=lambda k: diffs[k])
        print(
            f"  self-check of the {label} set: max abs diff {diffs[worst_name]:.3g} ({worst_name})"
        )
        if diffs[worst_name] > SELF_CHECK_TOL:
            problems.append(
                f"self-check of the {label} set: {worst_name} off by {diffs[worst_name]:.3g}"
            )
    return problems


# --------------------------------------------------------------------------- main


def _prepare(out: Path) -> None:
    """Empty ``out`` for a new set: a missing or empty folder, or one holding a previous set, \
never anything else.

    The set is written in place, not moved there afterwards, because the library
    records the verifier's path in every config.json at write time.
    """
    if out.exists():
        if not out.is_dir():
            raise SpecUIError(f"--out {out} exists and is not a folder")
        entries = list(out.iterdir())
        if entries and not (out / "manifest.json").is_file():
            raise SpecUIError(
                f"--out {out} is not empty and holds no fixture set (no manifest.json); refusing "
                "to overwrite"
            )
        for entry in entries:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    out.mkdir(parents=True, exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--out",
        type=Path,
        help="where to write the set (default: a new temporary folder; pass "
        f"{COMMITTED.relative_to(REPO)} explicitly to replace the committed set)",
    )
    ap.add_argument(
        "--check", action="store_true", help="compare the regenerated set with --against"
    )
    ap.add_argument(
        "--against",
        type=Path,
        default=COMMITTED,
        help="the set --check compares with (default: %(default)s)",
    )
    # 1e-4: the tolerance the conformance tests hold implementations to; torch 2.13 vs
    # 2.14 kernels alone differ by ~5e-6 here, a real change by orders of magnitude more.
    ap.add_argument(
        "--tol",
        type=float,
        default=1e-4,
        help="max abs diff allowed per float tensor in --check (default: %(default)s)",
    )
    a = ap.parse_args(argv)
    try:
        if a.check and not (a.against / "manifest.json").is_file():
            raise SpecUIError(f"--against {a.against} holds no fixture set (no manifest.json)")
        if a.tol < 0:
            raise SpecUIError(f"--tol must be >= 0, got {a.tol}")
        if a.out is not None and a.check and a.out.resolve() == a.against.resolve():
            raise SpecUIError(
                "--check would compare the set with itself: give --out another folder, or none"
            )
        _ensure_speculators()
        from loguru import logger

        # the library logs every file it opens (and a missing shard index) at INFO / WARNING
        logger.remove()
        logger.add(sys.stderr, level="ERROR")
        out = a.out if a.out is not None else Path(tempfile.mkdtemp(prefix="specui-fixtures-"))
        _prepare(out)
        try:
            generate(out)
        except BaseException:
            print(f"make_fixtures: failed; {out} holds an incomplete set", file=sys.stderr)
            raise
        print(f"make_fixtures: wrote {out}")
        if a.check:
            print(f"make_fixtures: comparing {out} with {a.against}")
            problems = compare(out, a.against, a.tol)
            for prob in problems:
                print(f"  MISMATCH {prob}")
            print("make_fixtures: check " + ("FAILED" if problems else "passed"))
            return 1 if problems else 0
        return 0
    except SpecUIError as e:
        print(f"make_fixtures: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
