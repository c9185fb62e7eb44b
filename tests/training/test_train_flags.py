"""``specui train`` takes speculators' training flag names beside its own (specui.commands.train).

Parsing with the real ``specui`` parser and building the TrainConfig the command trains
with; a real training run is covered by tests/training/test_training.py."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest

from specui.algorithms import algorithm_names
from specui.cli import build_parser
from specui.commands.train import (
    SPECULATORS_FLAG_ALIASES,
    SPECULATORS_FLAG_REWRITES,
    SPECULATORS_FLAGS_WITHOUT_EQUIVALENT,
    SPECULATORS_SHARED_FLAGS,
    build_config,
)
from specui.errors import SpecUIError
from specui.training.config import TrainConfig


def _train_parser() -> argparse.ArgumentParser:
    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["train"]


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["train", *argv])


def _config(*argv: str) -> TrainConfig:
    return build_config(_parse(*argv))


def _action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return parser._option_string_actions[flag]


# The same run said both ways: every setting away from its default.  The flags both spell alike
# come last, in BOTH_ARGV.
BOTH_ARGV = shlex.split(
    "--lr 1e-3 --seed 5 --block-size 16 --max-anchors 32 --weight-decay 0.05 --ttt-steps 2 "
    "--draft-vocab-size 4096 --mask-token-id 9 --markov-rank 64"
)
SPECUI_ARGV = (
    shlex.split(
        "--algorithm dflash --verifier some/verifier --out runs/x --steps 17 --warmup-steps 3 "
        "--schedule linear --layers 3 --aux-layers 1,3,4 --depths 6 --gamma 7.0 "
        "--confidence-weight 0.25 --cod-ratio 0.5 --cod-min-ratio 0.1 --loss kl --log-every 4 "
        "--init-from runs/dflash-1 --dpace --freeze-embeddings"
    )
    + BOTH_ARGV
)
SPECULATORS_ARGV = (
    shlex.split(
        "--speculator-type dflash --verifier-name-or-path some/verifier --save-path runs/x "
        "--max-steps 17 --scheduler-warmup-steps 3 --scheduler-type linear --num-layers 3 "
        "--target-layer-ids 1 3 4 --num-depths 6 --dflash-decay-gamma 7.0 "
        "--confidence-head-alpha 0.25 --down-sample-ratio 0.5 --down-sample-ratio-min 0.1 "
        "--loss-fn kl_div --log-freq 4 --from-pretrained runs/dflash-1 "
        "--per-position-loss-weight dpace --no-embed-requires-grad"
    )
    + BOTH_ARGV
)


def test_speculators_spellings_build_the_same_config_as_specui_names() -> None:
    ours, theirs = _config(*SPECUI_ARGV), _config(*SPECULATORS_ARGV)
    assert theirs == ours
    # Every flag, other algorithms' knobs too (a dflash config keeps only dflash's), parses alike.
    assert vars(_parse(*SPECULATORS_ARGV)) == vars(_parse(*SPECUI_ARGV))
    # ... and that config is the run asked for, not the defaults both might fall back to.
    default = TrainConfig(algorithm="dflash", out="runs/x").to_dict()
    # Every key, dflash's options (TrainConfig.options) as well as the shared fields:
    changed = {k for k, v in ours.to_dict().items() if v != default[k]}
    assert changed == {
        "verifier",
        "steps",
        "warmup_steps",
        "schedule",
        "layers",
        "aux_layer_ids",
        "gamma",
        "loss",
        "log_every",
        "init_from",
        "dpace",
        "lr",
        "seed",
        "block_size",
        "max_anchors",
        "weight_decay",
        "draft_vocab_size",
        "mask_token_id",
    }
    assert ours.aux_layer_ids == [1, 3, 4] and ours.loss == "kl" and ours.schedule == "linear"


@pytest.mark.parametrize("algorithm", algorithm_names(trainable=True))
def test_without_flags_the_cli_trains_the_configs_defaults(algorithm: str) -> None:
    """The flags' defaults are read from TrainConfig and the algorithms' options, not written
    again: no flag, no difference (each algorithm at its own option defaults)."""
    cli = _config("--algorithm", algorithm, "--out", "x")
    assert cli == TrainConfig(algorithm=algorithm, out="x")


def test_the_table_is_what_the_parser_does() -> None:
    parser = _train_parser()
    for theirs, ours in SPECULATORS_FLAG_ALIASES.items():
        assert _action(parser, theirs) is _action(parser, ours), theirs  # one argument, two names
    for theirs, ours in SPECULATORS_FLAG_REWRITES.items():
        assert _action(parser, theirs).dest == _action(parser, ours).dest, theirs
        assert (
            _action(parser, theirs).default is argparse.SUPPRESS
        )  # never overrides SpecUI's default
    for flag in SPECULATORS_SHARED_FLAGS:
        assert flag in parser._option_string_actions, flag
    for flag in SPECULATORS_FLAGS_WITHOUT_EQUIVALENT:
        assert flag not in parser._option_string_actions, flag


@pytest.mark.parametrize("flag", sorted(SPECULATORS_FLAGS_WITHOUT_EQUIVALENT))
def test_a_flag_without_equivalent_is_refused_not_ignored(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Also checks argparse's prefix matching does not take it for one of SpecUI's flags.
    with pytest.raises(SystemExit) as e:
        _parse("--algorithm", "dflash", "--out", "x", flag, "1")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("specui: error: unrecognized arguments: " + flag), err


def test_values_map_where_the_two_differ() -> None:
    base = ["--speculator-type", "peagle", "--save-path", "x"]
    assert _config(*base).algorithm == "peagle"
    assert _config(*base, "--scheduler-type", "none").schedule == "constant"
    assert _config(*base, "--scheduler-type", "cosine").schedule == "cosine"
    assert _config(*base, "--loss-fn", "ce").loss == "ce"
    assert _config(*base, "--loss-fn", "kl_div").loss == "kl"
    dflash = ["--speculator-type", "dflash", "--save-path", "x"]  # the knobs D-PACE applies to
    assert _config(*dflash, "--per-position-loss-weight", "dpace").options.dpace is True
    fixed = ["--dpace", "--per-position-loss-weight", "fixed-exp-decay"]
    assert _config(*dflash, *fixed).options.dpace is False
    freeze = ["--freeze-embeddings", "--embed-requires-grad"]
    assert _config(*base, *freeze).options.freeze_embeddings is False
    assert _config(*base, "--resume", "--no-resume-from-checkpoint").resume is False
    assert _config(*base, "--resume").resume is True
    # Space-separated (theirs), comma-separated (ours), or a mix: the same list.
    assert _config(*base, "--target-layer-ids", "2", "15", "27").aux_layer_ids == [2, 15, 27]
    assert _config(*base, "--aux-layers", "2,15", "27").aux_layer_ids == [2, 15, 27]
    # Not given: SpecUI's defaults, whatever speculators' are.
    plain, plain_dflash = _config(*base), _config(*dflash)
    assert (plain.resume, plain.options.freeze_embeddings, plain.schedule, plain.loss) == (
        False,
        False,
        "cosine",
        None,
    )
    assert plain_dflash.options.dpace is False


def test_unsupported_values_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        _parse("--speculator-type", "mtp", "--save-path", str(out))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert (
        "speculators' 'mtp' has no SpecUI trainer; use one of eagle3, dflash, dspark, peagle" in err
    )
    assert err.count("\n") == 1
    with pytest.raises(SystemExit):
        _parse("--algorithm", "dflash", "--out", str(out), "--per-position-loss-weight", "linear")
    assert "expected one of fixed-exp-decay, dpace, got 'linear'" in capsys.readouterr().err
    with pytest.raises(SpecUIError, match="unknown loss 'jsd'; use one of ce, kl"):
        _config("--algorithm", "dflash", "--out", str(out), "--loss-fn", "jsd")
    with pytest.raises(SpecUIError, match="unknown schedule 'warmup_stable'"):
        _config("--algorithm", "dflash", "--out", str(out), "--scheduler-type", "warmup_stable")
    assert not out.exists()


def test_help_shows_both_spellings(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        _parse("--help")
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for theirs, ours in SPECULATORS_FLAG_ALIASES.items():
        metavar = (
            _action(_train_parser(), ours).metavar or _action(_train_parser(), ours).dest.upper()
        )
        assert f"{ours} {metavar}" in text and f"{theirs} {metavar}" in text, theirs
    for theirs in SPECULATORS_FLAG_REWRITES:
        assert theirs in text
    assert (
        "--layers LAYERS, --num-layers LAYERS" in text
        and "--algorithm ALGORITHM, --speculator-type ALGORITHM" in text
    )


def test_the_training_matmul_precision_is_its_own_flag_and_keeps_its_old_spelling() -> None:
    """--matmul-precision sets the training matmuls; --precision (the verifier's precision on
    decode and bench) still works on train as its old spelling."""
    assert (
        _config("--algorithm", "dflash", "--out", "x", "--matmul-precision", "fp32").precision
        == "fp32"
    )
    assert _config("--algorithm", "dflash", "--out", "x", "--precision", "bf16").precision == "bf16"
    assert _config("--algorithm", "dflash", "--out", "x").precision == "auto"
    assert "--precision" in _action(_train_parser(), "--matmul-precision").option_strings
