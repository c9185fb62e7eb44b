"""One n-gram lookup on both backends: one NgramConfig reaches the local drafter, the vLLM
server's speculative config and the stored run, and the local lookup drafts what vLLM's does."""

from __future__ import annotations

import json
import random
import subprocess

import pytest
import torch

from specui.algorithms.base import DraftContext
from specui.algorithms.ngram import DEFAULT_NGRAM, NgramConfig
from specui.algorithms.resolve import resolve_drafter
from specui.algorithms.simple import NgramDrafter
from specui.cli import build_parser, main
from specui.commands import ngram_options
from specui.data import Prompt
from specui.errors import SpecUIError
from specui.service import DecodeRequest, record_run
from specui.store import Store
from specui.trace import SamplingParams
from specui.vllm.install import vllm_python
from specui.vllm.launch_plan import ServerConfig, build_speculative_config
from tests.support.verifiers import make_tiny_verifier
from tests.support.vllm_skip import needs_vllm


def _propose(drafter: NgramDrafter, tokens: list[int]) -> list[int]:
    ctx = DraftContext(torch.tensor(tokens, dtype=torch.long), None, SamplingParams(), None)
    return drafter.propose(ctx).token_ids


def test_config_takes_vllms_names_as_aliases_and_refuses_bad_sizes() -> None:
    assert NgramConfig.from_options(
        {"prompt_lookup_max": 5, "prompt_lookup_min": 3}
    ) == NgramConfig(5, 3)
    assert NgramConfig.from_options(
        {"max_ngram": 5, "prompt_lookup_max": 5, "min_ngram": None}
    ) == NgramConfig(5, DEFAULT_NGRAM.min_ngram)
    assert NgramConfig.from_options({"confidence_policy": "x"}) == DEFAULT_NGRAM  # not its option
    assert NgramConfig(5, 3).vllm_settings() == {"prompt_lookup_max": 5, "prompt_lookup_min": 3}
    with pytest.raises(SpecUIError, match="disagree"):
        NgramConfig.from_options({"max_ngram": 4, "prompt_lookup_max": 5})
    for bad in (
        {"min_ngram": 0},
        {"max_ngram": 2, "min_ngram": 3},
        {"max_ngram": 65},
        {"max_ngram": "4"},
        {"min_ngram": True},
    ):
        with pytest.raises(SpecUIError, match="ngram"):
            NgramConfig.from_options(bad)


def test_one_config_reaches_the_local_drafter_and_the_vllm_server() -> None:
    v = make_tiny_verifier()
    drafter = resolve_drafter(
        "ngram", v, 3, prompt_lookup_max=5, min_ngram=3, confidence_policy=None
    )
    assert drafter.config == NgramConfig(5, 3)
    served = build_speculative_config("ngram", 3, drafter.config)
    assert served == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 5,
        "prompt_lookup_min": 3,
    }
    # Untouched, both backends take the one default.
    assert resolve_drafter("ngram", v).config == ServerConfig().ngram == DEFAULT_NGRAM
    assert NgramConfig.from_options(build_speculative_config("ngram", None)) == DEFAULT_NGRAM


def test_command_line_sizes_go_to_ngram_by_either_name() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["bench", "--drafter", "ngram", "--prompt-lookup-max", "5", "--min-ngram", "3"]
    )
    assert ngram_options(args) == {"max_ngram": 5, "min_ngram": 3}
    served = parser.parse_args(["vllm", "bench", "--speculator", "ngram", "--max-ngram", "6"])
    assert ngram_options(served) == {"max_ngram": 6}


def test_bad_sizes_on_the_command_line_store_nothing(tmp_path, capsys) -> None:
    db = tmp_path / "s.db"
    rc = main(
        [
            "bench",
            "--drafter",
            "ngram",
            "--prompts",
            "demo",
            "--max-ngram",
            "2",
            "--min-ngram",
            "3",
            "--db",
            str(db),
        ]
    )
    assert rc == 2 and "min_ngram=3, max_ngram=2" in capsys.readouterr().err
    assert not db.exists()


def test_lookup_takes_the_longest_match_at_its_earliest_place() -> None:
    d = NgramDrafter(3, NgramConfig(4, 2))
    # Suffix 1 2 3 occurs at 0 and at 4: the earliest is taken (vLLM's rule).
    assert _propose(d, [1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3]) == [9, 1, 2]
    # A 3-gram match (at 4) beats an earlier 2-gram one (2 3 at 1).
    assert _propose(d, [5, 2, 3, 6, 1, 2, 3, 8, 1, 2, 3]) == [8, 1, 2]
    # Only a 1-gram recurs: below min_ngram 2 nothing is drafted; min_ngram 1 drafts it.
    assert _propose(d, [4, 5, 6, 7, 4]) == []
    assert _propose(NgramDrafter(3, NgramConfig(4, 1)), [4, 5, 6, 7, 4]) == [5, 6, 7]
    # Fewer than K tokens follow the match: as many as there are.
    assert _propose(d, [1, 2, 1, 2]) == [1, 2]
    assert d.stored_settings == {"max_ngram": 4, "min_ngram": 2}


_VLLM_LOOKUP = """
import json, sys
import numpy as np
from vllm.v1.spec_decode import ngram_proposer
look = ngram_proposer._find_longest_matched_ngram_and_propose_tokens
out = []
for tokens, hi, lo, k in json.load(sys.stdin):
    # (tokens, min_ngram, max_ngram, max_model_len, k)
    out.append(look(np.array(tokens, dtype=np.int32), lo, hi, 10**6, k).tolist())
print(json.dumps(out))
"""


@needs_vllm
def test_local_lookup_drafts_what_vllms_proposer_drafts() -> None:
    """vLLM's own proposer function, run in .venv-vllm, on random sequences over a small
    vocabulary (many repeats, ties between places and sizes): the local drafter's proposal
    is the same at every one."""
    rng = random.Random(0)
    cases = []
    for _ in range(300):
        hi = rng.randint(1, 5)
        lo = rng.randint(1, hi)
        tokens = [rng.randrange(rng.choice((2, 3, 5))) for _ in range(rng.randint(2, 40))]
        cases.append((tokens, hi, lo, rng.randint(1, 6)))
    done = subprocess.run(
        [vllm_python(), "-c", _VLLM_LOOKUP],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    ours = [_propose(NgramDrafter(k, NgramConfig(hi, lo)), t) for t, hi, lo, k in cases]
    mismatched = [(c, o, t) for c, o, t in zip(cases, ours, theirs, strict=True) if o != t]
    assert not mismatched, mismatched[:3]
    assert sum(1 for t in theirs if t) > 100  # the cases did exercise drafting


def test_a_stored_ngram_run_records_its_sizes(tmp_path) -> None:
    v = make_tiny_verifier(vocab_size=8)
    store = Store(tmp_path / "s.db")
    drafter = NgramDrafter(3, NgramConfig(5, 3))
    prompt = Prompt(id="p", source="t", token_ids=(1, 2, 3, 1, 2, 3, 1, 2))
    recorded = record_run(
        store,
        v,
        drafter,
        [prompt],
        prompt_set="t",
        request=DecodeRequest(drafter="ngram", max_new_tokens=12),
    )
    settings = store.get_run(recorded.run_id).settings
    assert (settings["max_ngram"], settings["min_ngram"]) == (5, 3)
    result = recorded.results[0]
    # The live summary's tokens per step is the output over the verifier passes.
    assert result.summary()["tokens_per_step"] == pytest.approx(
        len(result.output_token_ids) / result.num_steps
    )
    store.close()
