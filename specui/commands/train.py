"""``specui train``: train a drafter by self-distillation, with a progress bar.

    specui train --algorithm dflash --verifier embedded --prompts general --out runs/dflash
    specui train ... --extractor vllm    # hidden states from a vLLM server (.venv-vllm)

Runs under ``torchrun --nproc-per-node N -m specui train ...`` too (DDP).

speculators' own spellings of the flags SpecUI has an equivalent for are accepted too
(``--speculator-type dflash --save-path runs/dflash --num-layers 2 ...``); see
SPECULATORS_FLAG_ALIASES.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from specui.algorithms.options import flag_of
from specui.algorithms.spec import algorithm_names, algorithm_specs, labels, train_knobs
from specui.commands import int_list
from specui.data import prompt_sets, training_prompt_sets
from specui.errors import SpecUIError
from specui.training.config import DEFAULT_PROMPTS, GROUPS, PRECISIONS, TrainConfig

# --- speculators' flag names -----------------------------------------------------------
#
# Read from vllm-project/speculators at commit c05b95b303f7d4f21e8d7624e0ffa1c2d9b4d73b:
# scripts/train.py parses TrainConfig.resolve(), whose flags are generated from the fields
# of src/speculators/train/config/schema.py by src/speculators/train/config/resolution.py
# ("--" + field name with "_" -> "-"; a bool defaulting to True/None, or tagged, gets
# --x/--no-x).  Defaults are not carried over: each name keeps SpecUI's default.
#
# speculators flag -> SpecUI flag, as another option string of the same argument:
SPECULATORS_FLAG_ALIASES: dict[str, str] = {
    "--speculator-type": "--algorithm",  # values: speculator_types()
    "--verifier-name-or-path": "--verifier",
    "--save-path": "--out",
    # warm start; SpecUI copies the tensors whose name and shape fit
    "--from-pretrained": "--init-from",
    "--max-steps": "--steps",  # optimizer steps; SpecUI's LR schedule spans them, theirs the epochs
    "--scheduler-type": "--schedule",  # values: SPECULATORS_SCHEDULES
    "--scheduler-warmup-steps": "--warmup-steps",
    "--num-layers": "--layers",
    # theirs space-separated (2 15 27), ours 2,15,27: both take both
    "--target-layer-ids": "--aux-layers",
    "--num-depths": "--depths",  # P-EAGLE parallel depths
    "--dflash-decay-gamma": "--gamma",  # both weight slot k by exp(-(k-1)/gamma)
    "--confidence-head-alpha": "--confidence-weight",  # DSpark confidence-head BCE weight
    "--down-sample-ratio": "--cod-ratio",  # both keep max(r^d, r_min) of the depth-d rows
    "--down-sample-ratio-min": "--cod-min-ratio",
    "--loss-fn": "--loss",  # values: SPECULATORS_LOSSES
    "--log-freq": "--log-every",  # both in steps
}
# speculators flag -> SpecUI flag, as a separate argument writing the same setting, because
# the form differs (a value where SpecUI has a switch, or the switch's opposite):
SPECULATORS_FLAG_REWRITES: dict[str, str] = {
    "--per-position-loss-weight": "--dpace",  # dpace -> --dpace; fixed-exp-decay -> without it
    # the opposite: trains the embedding (SpecUI: P-EAGLE only)
    "--embed-requires-grad": "--freeze-embeddings",
    "--no-embed-requires-grad": "--freeze-embeddings",
    "--no-resume-from-checkpoint": "--resume",  # the opposite; SpecUI resumes only with --resume
}
# Spelled the same in both (nothing to add; listed so the table is the whole mapping):
SPECULATORS_SHARED_FLAGS: tuple[str, ...] = (
    "--seed",
    "--lr",
    "--weight-decay",
    "--block-size",
    "--max-anchors",
    "--ttt-steps",
    "--draft-vocab-size",
    "--mask-token-id",
    "--markov-rank",
)
# Their flags with no SpecUI equivalent, and why; not accepted (a silent no-op would
# train something other than what the command line says):
SPECULATORS_FLAGS_WITHOUT_EQUIVALENT: dict[str, str] = {
    # No SpecUI training setting at all:
    **dict.fromkeys(
        (
            "--config",
            "--dump-config",
            "--dry-run",
            "--deterministic-cuda",
            "--trust-remote-code",
            "--draft-config",
            "--draft-arch",
            "--draft-hidden-act",
            "--draft-mrope-full-head-hack",
            "--no-draft-mrope-full-head-hack",
            "--norm-before-residual",
            "--no-norm-before-residual",
            "--norm-before-fc",
            "--no-norm-before-fc",
            "--fc-norm",
            "--norm-output",
            "--no-norm-output",
            "--sliding-window",
            "--full-attention-indices",
            "--sliding-window-non-causal",
            "--draft-attn-impl",
            "--train-data-ratio",
            "--noise-std",
            "--hidden-states-dtype",
            "--num-workers",
            "--prefetch-factor",
            "--on-missing",
            "--on-generate",
            "--request-timeout",
            "--max-retries",
            "--loss-implementation",
            "--ttt-step-loss-decay",
            "--scheduler-warmup-ratio",
            "--save-best",
            "--fsdp-shard",
            "--logger",
            "--log-dir",
            "--run-name",
            "--markov-head-type",
            "--enable-confidence-head",
            "--no-enable-confidence-head",
            "--confidence-head-with-markov",
            "--no-confidence-head-with-markov",
        ),
        "no SpecUI setting",
    ),
    # A near neighbour that means something else:
    "--data-path": "a preprocessed dataset; SpecUI distills from --prompts itself",
    "--token-freq-path": "SpecUI counts token frequencies in its distilled samples",
    "--d2t-path": "SpecUI builds the draft vocabulary mapping",
    "--t2d-path": "SpecUI builds the mapping",
    "--hidden-states-backend": "a transfer backend; --extractor picks who computes the states",
    "--hidden-states-path": "their files; --cache-dir holds SpecUI's own layout",
    "--vllm-endpoint": "a running server; --extractor vllm launches its own",
    "--total-seq-len": "a packed-batch length; --max-seq-len cuts each sample",
    "--epochs": "SpecUI counts steps (--steps)",
    "--checkpoint-freq": "in epochs; --checkpoint-every is in steps",
    "--scheduler-total-steps": "SpecUI's schedule always spans --steps",
    "--scheduler-num-cosine-cycles": "SpecUI's cosine is half a cycle, down to lr * --min-lr-ratio",
    "--optimizer": "SpecUI trains with AdamW only",
    "--muon-lr": "AdamW only",
    "--muon-momentum": "AdamW only",
    "--muon-weight-decay": "AdamW only",
    "--muon-ns-steps": "AdamW only",
    "--muon-adjust-lr-fn": "AdamW only",
    "--sample-from-anchor": "fixed by the algorithm (DSpark yes, DFlash no: their defaults)",
    "--no-sample-from-anchor": "fixed by the algorithm",
    "--dpace-alpha": "SpecUI's D-PACE smoothing is fixed at 0.5, their default",
    "--num-speculative-steps": "MTP: no SpecUI trainer",
    "--step-weight-beta": "MTP: no SpecUI trainer",
    # hs_connectors' backend flags (--hidden-states-path, --mooncake-*) have none either.
}
# Values of aliased flags: speculators value -> SpecUI value (None: none in SpecUI).
# speculators' --speculator-type values are SpecUI's algorithm names (speculators_model_type);
# the registry's are read when the flag is parsed.  MTP: speculators trains it, SpecUI does not.
SPECULATOR_TYPES_WITHOUT_TRAINER: tuple[str, ...] = ("mtp",)


def speculator_types() -> dict[str, str | None]:
    """speculators --speculator-type value -> SpecUI algorithm (None: no SpecUI trainer)."""
    # stable
    specs = sorted((s for s in algorithm_specs() if s.trainable), key=lambda s: s.speculators_rank)
    return {**{s.name: s.name for s in specs}, **dict.fromkeys(SPECULATOR_TYPES_WITHOUT_TRAINER)}


# none: constant LR
SPECULATORS_SCHEDULES: dict[str, str] = {"linear": "linear", "cosine": "cosine", "none": "constant"}
# kl_div is KL(p_target || q_draft), SpecUI's kl; rkl, jsd, tv, nla, lk_hybrid and JSON mixes have
# none.
SPECULATORS_LOSSES: dict[str, str] = {"ce": "ce", "kl_div": "kl"}
# -> --dpace
SPECULATORS_POSITION_WEIGHTS: dict[str, bool] = {"fixed-exp-decay": False, "dpace": True}


# SpecUI's own older flag -> its flag now, kept so that existing command lines still run.
# --precision was the training matmul precision here and is the verifier's precision on every
# other command (decode, bench, doctor): train's is --matmul-precision now.
OLD_SPELLINGS: dict[str, str] = {"--precision": "--matmul-precision"}


def _spellings(flag: str) -> list[str]:
    """SpecUI's flag, then its older spelling (OLD_SPELLINGS) and the speculators spellings
    that alias it (SPECULATORS_FLAG_ALIASES)."""
    aliases = {**OLD_SPELLINGS, **SPECULATORS_FLAG_ALIASES}
    return [flag, *(old for old, ours in aliases.items() if ours == flag)]


class _IntsAction(argparse.Action):
    """--aux-layers 2,15,27 and speculators' --target-layer-ids 2 15 27 (or a mix): one list."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, [i for part in values for i in part])


def _algorithm(text: str) -> str:
    key = text.strip().lower()
    types = speculator_types()
    if key in types and types[key] is None:
        known = ", ".join(v for v in types.values() if v)
        raise argparse.ArgumentTypeError(
            f"speculators' {key!r} has no SpecUI trainer; use one of {known}"
        )
    # Anything else as given: the config reports an unknown algorithm with the list, as the job API
    # does.
    return types.get(key) or text


def _default_layers() -> str:
    """'dflash/dspark/peagle 2, eagle3 1': the algorithms grouped by their default depth."""
    by_depth: dict[int, list[str]] = {}
    for spec in algorithm_specs():
        if spec.trainable:
            by_depth.setdefault(spec.default_layers, []).append(spec.name)
    return ", ".join(f"{'/'.join(names)} {depth}" for depth, names in by_depth.items())


def _schedule(text: str) -> str:
    return SPECULATORS_SCHEDULES.get(text, text)  # SpecUI's own names pass; the config checks them


def _loss(text: str) -> str:
    return SPECULATORS_LOSSES.get(text, text)  # others as given: the config names the valid ones


def _position_weights(text: str) -> bool:
    if text not in SPECULATORS_POSITION_WEIGHTS:
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join(SPECULATORS_POSITION_WEIGHTS)}, got {text!r}"
        )
    return SPECULATORS_POSITION_WEIGHTS[text]


def _prompts_help() -> str:
    """--prompts' help from the prompt-set registry (a set added there is listed here)."""
    sets = prompt_sets()
    trainable = training_prompt_sets()
    # Evaluation-only sets by family ("spec-bench" for it and its "spec-bench:qa" groups).
    refused = sorted({name.split(":", 1)[0] for name, ps in sets.items() if ps.evaluation_only})
    text = (
        f"a prompt set ({', '.join(trainable)}; default {DEFAULT_PROMPTS}), a JSONL file, "
        "or a mix a,b (alternating)"
    )
    if refused:
        its = "its" if len(refused) == 1 else "their"
        text += f"; evaluation sets ({', '.join(refused)} and {its} groups) are refused"
    return text


def _add_knobs(groups: dict[str, argparse._ArgumentGroup]) -> None:
    """A flag for every training option of every trainable algorithm (its package's options.py),
    in its group, its help led by the algorithms that read it."""
    for name, f in train_knobs().items():
        # Unset unless given: TrainConfig then fills in the chosen algorithm's own default.
        kw: dict[str, Any] = {
            "dest": name,
            "default": argparse.SUPPRESS,
            "help": f"{labels(name)} {f.metadata['help']}",
        }
        if isinstance(f.default, bool):
            kw["action"] = "store_true" if f.default is False else argparse.BooleanOptionalAction
        else:
            kw["type"] = type(f.default)
        groups[f.metadata["group"]].add_argument(*_spellings(flag_of(f)), **kw)


def _flag_overrides() -> dict[str, dict[str, Any]]:
    """Where a setting's flag is more than its field says (a parser of speculators' values, a
    list's form, a help made from the registries); every other setting's flag is generated."""
    return {
        # Not argparse choices: the config reports an unknown algorithm with the list, as the
        # job API does.
        "algorithm": {
            "type": _algorithm,
            "required": True,
            "help": " | ".join(algorithm_names(trainable=True)),
        },
        "prompts": {"help": _prompts_help()},
        "out": {"required": True},
        "schedule": {"type": _schedule},
        "matmul_precision": {"choices": PRECISIONS},
        "layers": {"help": f"draft decoder layers (default: {_default_layers()})"},
        "aux_layer_ids": {
            "type": int_list,
            "nargs": "+",
            "action": _IntsAction,
            "metavar": "IDS",
            "help": "verifier layer ids, e.g. 2,15,27 (or 2 15 27)",
        },
        "snapshot_steps": {
            "type": int_list,
            "nargs": "+",
            "action": _IntsAction,
            "metavar": "STEPS",
            "help": "steps whose drafter is also kept for good in OUT/snapshots/step-N (bf16):"
            " a scaling study's points, e.g. 250,500,1000",
        },
        "loss": {"type": _loss, "default": None},
    }


def _add_settings(groups: dict[str, Any]) -> None:
    """A flag for every shared setting (TrainConfig's fields), in its group, from its field:
    ``--`` + its name (or its ``flag``), its help, its type."""
    overrides = _flag_overrides()
    for f in TrainConfig.settings():
        kw: dict[str, Any] = {"dest": f.name, "help": f.metadata["help"]}
        kind = TrainConfig.setting_type(f)
        if kind is bool:
            kw["action"] = "store_true" if f.default is False else argparse.BooleanOptionalAction
        else:
            kw["type"] = kind
        kw.update(overrides.get(f.name, {}))
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        groups[f.metadata["group"]].add_argument(*_spellings(flag), **kw)


def _config_defaults(p: argparse.ArgumentParser) -> None:
    """Each shared flag's default is TrainConfig's, read from its field (written there only);
    a dest that a speculators spelling also writes keeps its own (SUPPRESS: never overrides)."""
    suppressed = {a.dest for a in p._actions if a.default is argparse.SUPPRESS}
    p.set_defaults(
        **{
            f.name: f.default
            for f in dataclasses.fields(TrainConfig)
            if f.default is not dataclasses.MISSING and f.name not in suppressed
        }
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a drafter (DFlash, DSpark, P-EAGLE, EAGLE-3) on the verifier's own outputs",
    )
    groups = {
        "run": p,
        **{g: p.add_argument_group(g) for g in GROUPS if g != "run"},
    }
    _add_settings(groups)
    _add_knobs(groups)
    p.add_argument(
        "--no-resume-from-checkpoint",
        dest="resume",
        action="store_const",
        const=False,
        default=argparse.SUPPRESS,
        help="speculators' spelling of the default: start afresh (without --resume)",
    )

    # speculators' spellings of two knobs, in another form (SPECULATORS_FLAG_REWRITES)
    freeze = {"dest": "freeze_embeddings", "action": "store_const", "default": argparse.SUPPRESS}
    groups["drafter"].add_argument(
        "--no-embed-requires-grad",
        const=True,
        help="speculators' spelling of --freeze-embeddings",
        **freeze,
    )
    groups["drafter"].add_argument(
        "--embed-requires-grad",
        const=False,
        help="speculators' spelling of the default: train the embedding",
        **freeze,
    )
    groups["loss"].add_argument(
        "--per-position-loss-weight",
        dest="dpace",
        type=_position_weights,
        default=argparse.SUPPRESS,
        metavar="{fixed-exp-decay,dpace}",
        help="speculators' spelling: dpace = --dpace",
    )
    groups["bookkeeping"].add_argument(
        "--no-progress", action="store_true", help="no progress bar (log lines only)"
    )
    _config_defaults(p)
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of parsed ``specui train`` arguments (SpecUIError for a bad value)."""
    # Every key TrainConfig reads (a knob added to an algorithm's options has its flag): the
    # parser's dest of each is its name.
    names = [f.name for f in TrainConfig.settings()] + list(train_knobs())
    return TrainConfig.from_dict({k: getattr(args, k) for k in names if hasattr(args, k)})


def run(args: argparse.Namespace) -> int:
    cfg = build_config(args)

    import os

    from tqdm import tqdm

    from specui.training.hooks import TrainHooks
    from specui.training.loop import train
    from specui.training.progress import stage_unit

    main = int(os.environ.get("RANK", "0")) == 0
    bar = None  # made at the first step (after data preparation), starting at a resumed step
    stage_bars: dict[str, tqdm] = {}  # one per data-preparation stage while it runs

    def say(line: str) -> None:
        if main:
            tqdm.write(line, file=sys.stderr)  # above the bars, not through them

    def progress(step: int, total: int, metrics: dict[str, float]) -> None:
        nonlocal bar
        if args.no_progress or not main:
            return
        if bar is None:
            bar = tqdm(
                total=total,
                initial=step,
                desc="training",
                unit="step",
                dynamic_ncols=True,
                file=sys.stderr,
            )
        bar.update(step - bar.n)  # update, not n =: tqdm's rate (and ETA) follows the updates
        if metrics:
            bar.set_postfix(
                loss=f"{metrics['loss']:.3f}",
                tau=f"{metrics.get('accept_len', float('nan')):.2f}",
                refresh=False,
            )
        bar.refresh()

    def stage(what: str, done: int, total: int) -> None:
        if not main:
            return
        if args.no_progress:
            if done == total:
                say(f"{what}: {done}/{total}")
            return
        b = stage_bars.get(what)
        if b is None:
            if done >= total:
                return  # nothing left to do (all cached): no bar
            b = stage_bars[what] = tqdm(
                total=total,
                initial=done,
                desc=what,
                unit=stage_unit(what),
                dynamic_ncols=True,
                file=sys.stderr,
            )
        b.update(done - b.n)
        if done >= total:
            b.close()
            del stage_bars[what]

    try:
        result = train(cfg, TrainHooks(progress=progress, log=say, stage=stage))
    finally:
        for b in [*stage_bars.values(), *([bar] if bar is not None else [])]:
            b.close()
    if main:
        m = result.metrics
        summary = f"{result.status} at step {result.step}: {result.out}"
        if m:
            summary += (
                f" (loss {m.get('loss', float('nan')):.4f}, accept_len"
                f" {m.get('accept_len', float('nan')):.2f})"
            )
        print(summary)
    if result.status == "cancelled":
        raise SpecUIError("training was cancelled")
    return 0
