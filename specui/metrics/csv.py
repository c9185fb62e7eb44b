"""CSV export of a comparison and of stored steps.

UTF-8 (optionally with a BOM for Excel), stable snake_case headers, empty cells for
undefined values.  Text cells that a spreadsheet would run as a formula (leading
= + - @ tab CR) get a leading apostrophe (OWASP CSV injection advice): labels and token
texts are user- or model-written.  Owner session ids, pids and host names never go into
a CSV.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from specui.errors import SpecUIError
from specui.metrics.columns import STEP_COLUMNS, Column
from specui.store import Store

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any, kind: str) -> str:
    """One cell: blank for None and non-finite floats, repr for floats (every digit)."""
    if value is None:
        return ""
    if kind == "text":
        text = str(value)
        return "'" + text if text.startswith(_FORMULA_START) else text
    if isinstance(value, float):
        return "" if not math.isfinite(value) else repr(value)
    return str(value)


def write_csv(
    columns: Sequence[Column],
    rows: Iterable[dict[str, Any]],
    dest: str | Path | IO[str],
    *,
    bom: bool = False,
) -> None:
    """Write rows under ``columns`` (header = column keys)."""
    if isinstance(dest, str | Path):
        try:
            with open(dest, "w", newline="", encoding="utf-8-sig" if bom else "utf-8") as f:
                _write_rows(columns, rows, f)
        except OSError as e:
            raise SpecUIError(f"cannot write {dest}: {e.strerror or e}") from None
    else:
        if bom:
            dest.write("\ufeff")
        _write_rows(columns, rows, dest)


def _write_rows(columns: Sequence[Column], rows: Iterable[dict[str, Any]], f: IO[str]) -> None:
    w = csv.writer(f, lineterminator="\r\n")  # RFC 4180 line ends
    w.writerow([c.key for c in columns])
    for row in rows:
        w.writerow([_cell(row.get(c.key), c.kind) for c in columns])


def iter_step_rows(store: Store, run_ids: Sequence[int]) -> Iterable[dict[str, Any]]:
    """Stored steps as STEP_COLUMNS dicts, run by run, prompt by prompt (streamed).
    Unknown run ids raise here, before anything is written."""
    for rid in run_ids:
        store.get_run(rid)
    return _step_rows(store, list(run_ids))


def _step_rows(store: Store, run_ids: list[int]) -> Iterator[dict[str, Any]]:
    keys = [c.key for c in STEP_COLUMNS[3:]]  # stored step columns, after run/prompt/step
    for rid in run_ids:
        with store.read() as s:
            rows = s.connection().exec_driver_sql(
                f"SELECT r.prompt_index, s.step, {', '.join('s.' + k for k in keys)} FROM steps s"
                " JOIN results r ON s.result_id = r.id WHERE r.run_id = ? ORDER BY r.prompt_index,"
                " s.step",
                (rid,),
            )
            for row in rows:
                d = {"run_id": rid, "prompt_index": row[0], "step": row[1]}
                d.update(zip(keys, row[2:], strict=True))
                yield d


def write_steps_csv(
    store: Store, run_ids: Sequence[int], dest: str | Path | IO[str], *, bom: bool = False
) -> None:
    """Every stored step of the runs under STEP_COLUMNS, streamed (a run can hold 10^5 steps)."""
    write_csv(STEP_COLUMNS, iter_step_rows(store, run_ids), dest, bom=bom)


def csv_text(columns: Sequence[Column], rows: Iterable[dict[str, Any]]) -> str:
    """The CSV as one string (the API returns it in its response)."""
    buf = io.StringIO()
    write_csv(columns, rows, buf)
    return buf.getvalue()
