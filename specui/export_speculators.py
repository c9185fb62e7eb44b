"""Stored runs as speculators' ``acceptance.csv`` (``specui runs export --format speculators``).

The file speculators' evaluation script writes, read from vllm-project/speculators at commit
c05b95b303f7d4f21e8d7624e0ffa1c2d9b4d73b (``scripts/evaluate/evaluate.py`` and
``scripts/evaluate/perf_utils.py``):

* Columns, in order: ``subset``, ``num_drafts``, ``num_draft_tokens``,
  ``num_accepted_tokens``, ``acceptance_length``, ``acceptance_at_pos_0`` ..
  ``acceptance_at_pos_{K-1}`` (``["subset"] + acceptance_csv_columns(spec)``).
* One row per subset (a benchmark slice of one served drafter); a subset whose run
  drafted nothing gets no row (evaluate.py logs "No speculative decoding metrics found").
* ``acceptance_length`` = 1 + accepted / drafts.
* ``acceptance_at_pos_i`` = vLLM's ``spec_decode_num_accepted_tokens_per_pos[i]`` / drafts,
  a fraction in [0, 1], position 0-based.  vLLM counts position i of a draft when
  i < its accepted-prefix length (``SpecDecodingStats.observe_draft`` in
  vllm/v1/spec_decode/metrics.py, vLLM 0.32), so it is the *cumulative* rate, the share
  of drafts whose first i+1 tokens were all accepted, not the rate given position i-1
  was accepted.
* Written with ``csv.DictWriter`` (excel dialect, CRLF line ends); a position a row has
  no value for is an empty cell.

SpecUI's a_k (``specui.metrics.comparison``, column ``acceptance_pos_k``) is drafts whose
slot k was accepted / drafts with k 1-based, and a slot counts as accepted only when all
slots before it were: the same cumulative fraction.  So
``acceptance_at_pos_{k-1} = a_k``: a shift of the index, no conversion of the value.
``num_drafts`` (steps that drafted at least one token), ``num_draft_tokens``
(SpecUI's ``num_drafted_tokens``), ``num_accepted_tokens`` and ``acceptance_length``
are the same quantities as vLLM's counters.

No speculators tool reads the file back: their ``plot.py`` plots ``perf_results.csv``
or guidellm's JSON (``perf_utils.load_data``: ``csv.DictReader``, then ``float()`` of
the columns it needs).  That same reading (csv module, keys by header name, floats)
is what this file is made for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from specui.metrics.columns import Column
from specui.metrics.comparison import compare
from specui.metrics.csv import write_csv
from specui.store import Store, user_error

# Where the format was read, for the module notes above and for error messages.
SPECULATORS_SOURCE = "vllm-project/speculators@c05b95b3 scripts/evaluate/evaluate.py, perf_utils.py"

HEAD_COLUMNS: list[Column] = [
    Column(
        "subset", "Subset", "The run's prompt set (speculators: the benchmark subset)", "", "text"
    ),
    Column("num_drafts", "Drafts", "Steps that drafted at least one token", "steps", "int"),
    Column(
        "num_draft_tokens",
        "Drafted tokens",
        "Draft tokens proposed, over all steps",
        "tokens",
        "int",
    ),
    Column(
        "num_accepted_tokens",
        "Accepted tokens",
        "Draft tokens the verifier accepted",
        "tokens",
        "int",
    ),
    Column("acceptance_length", "τ", "1 + accepted draft tokens / drafts", "tokens/step"),
]

# speculators' column <- SpecUI's comparison column (specui.metrics.BASE_COLUMNS).
_FROM_COMPARISON = {
    "num_drafts": "num_drafts",
    "num_draft_tokens": "num_drafted_tokens",
    "num_accepted_tokens": "num_accepted_tokens",
    "acceptance_length": "acceptance_length",
}


def position_column(i: int) -> Column:
    """speculators' 0-based position column; it holds SpecUI's a_{i+1}."""
    return Column(
        f"acceptance_at_pos_{i}",
        f"a_{i + 1}",
        f"Drafts whose first {i + 1} draft token(s) were all accepted / drafts",
        "fraction",
    )


@dataclass(frozen=True)
class AcceptanceTable:
    columns: list[Column]
    rows: list[dict[str, Any]]  # keyed by Column.key
    run_ids: list[int]  # the run of each row, in row order
    skipped: list[int]  # runs without a single draft (a baseline): no row, as evaluate.py does


def acceptance_table(store: Store, run_ids: Sequence[int]) -> AcceptanceTable:
    """speculators' acceptance rows for these runs, from the comparison's own numbers.

    Raises SpecUIError (before anything is written) for an unknown run, for no run with
    drafts, and for two runs on the same prompt set: the file holds one row per subset,
    as evaluate.py writes one file per served drafter."""
    cmp = compare(store, list(run_ids))
    # a_1..a_K: the comparison's position columns are "acceptance_pos_{k}", k = 1..k_max.
    k_max = sum(1 for c in cmp.columns if c.key.startswith("acceptance_pos_"))
    columns = HEAD_COLUMNS + [position_column(i) for i in range(k_max)]
    rows: list[dict[str, Any]] = []
    kept: list[int] = []
    skipped: list[int] = []
    by_subset: dict[str, int] = {}
    for src in cmp.rows:
        if not src["num_drafts"]:
            skipped.append(src["run_id"])
            continue
        subset = src["prompt_set"]
        if subset in by_subset:
            raise user_error(
                f"runs {by_subset[subset]} and {src['run_id']} are both on prompt set {subset!r}: "
                "speculators' acceptance.csv has one row per subset (one file per drafter); "
                "export them in separate files"
            )
        by_subset[subset] = src["run_id"]
        row: dict[str, Any] = {"subset": subset}
        row.update({theirs: src[ours] for theirs, ours in _FROM_COMPARISON.items()})
        for i in range(k_max):
            # None past the run's own K (never drafted) -> an empty cell, as DictWriter
            # leaves a position that row does not have.
            row[f"acceptance_at_pos_{i}"] = src[f"acceptance_pos_{i + 1}"]
        rows.append(row)
        kept.append(src["run_id"])
    if not rows:
        listed = ", ".join(map(str, skipped)) or "none"
        raise user_error(f"no run with drafts to export (runs without drafts: {listed})")
    return AcceptanceTable(columns, rows, kept, skipped)


def write_acceptance_csv(
    store: Store, run_ids: Sequence[int], dest: str | Path | IO[str]
) -> AcceptanceTable:
    """Write speculators' acceptance.csv for these runs to ``dest`` (a path or a text stream).

    Never with a BOM: their readers open the file as plain UTF-8, where a BOM would turn
    the first header into '\\ufeffsubset'."""
    table = acceptance_table(store, run_ids)
    write_csv(table.columns, table.rows, dest)
    return table
