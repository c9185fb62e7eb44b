"""The report as text, JSON, HTML (the dashboard), and where it is stored.

A report is kept beside the speculator (``doctor.json`` in its folder) only when
that folder is one the app owns and may write (inside the data dir); shipped and
foreign folders stay untouched, and their report goes to the data dir, keyed by
the folder's resolved path.  Written to a temporary file and renamed: a reader
never sees half a report.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import json
import os
import tempfile
from pathlib import Path

from specui.doctor.findings import Report, Severity
from specui.paths import data_dir

REPORT_FILE = "doctor.json"
ICON = {Severity.ERROR: "❌", Severity.WARNING: "⚠️", Severity.INFO: "ℹ️"}


def report_path(folder: str | os.PathLike) -> Path:
    """Where the report of the speculator at ``folder`` lives."""
    folder = Path(folder).resolve()
    if folder.is_relative_to(data_dir().resolve()) and os.access(folder, os.W_OK):
        return folder / REPORT_FILE
    key = hashlib.sha256(str(folder).encode()).hexdigest()[:16]
    return data_dir() / "doctor" / f"{folder.name}-{key}.json"


def save_report(report: Report) -> Path:
    """Write ``report`` where ``report_path`` says, atomically."""
    dest = report_path(report.speculator)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(report.to_dict(), f, indent=2, ensure_ascii=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return dest


def load_report(folder: str | os.PathLike) -> Report | None:
    """The stored report of ``folder``, or None (none yet, or unreadable)."""
    try:
        return Report.from_dict(json.loads(report_path(folder).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def to_text(report: Report) -> str:
    """The CLI's report: findings in rank order, each with evidence, cause and fix."""
    lines = [
        f"speculator doctor: {report.speculator}",
        f"verifier {report.verifier}; prompts {report.prompts or '-'}; {report.wall_time_s:.1f} s",
        "",
    ]
    for i, f in enumerate(report.findings, 1):
        lines.append(f"{i}. [{f.severity}] {f.title}")
        for label, value in (("evidence", f.evidence), ("cause", f.cause), ("fix", f.fix)):
            if value:
                lines.append(f"     {label}: {value}")
    n_err = len(report.errors)
    lines += ["", f"{n_err} error(s), {len(report.findings)} finding(s)"]
    return "\n".join(lines)


def to_html(report: Report) -> str:
    """The dashboard's report view: an ordered list whose items carry the finding's code."""
    items = []
    for f in report.findings:
        detail = "".join(
            f"<div class='doctor-{label}'><b>{label}</b>: {html.escape(value)}</div>"
            for label, value in (("evidence", f.evidence), ("cause", f.cause), ("fix", f.fix))
            if value
        )
        items.append(
            f"<li data-code='{html.escape(f.code)}' data-severity='{f.severity}'>{ICON[f.severity]}"
            f" <b>{html.escape(f.title)}</b>{detail}</li>"
        )
    head = (
        f"<p><code>{html.escape(report.speculator)}</code> · verifier"
        f" <code>{html.escape(report.verifier)}</code> · prompts"
        f" <code>{html.escape(report.prompts or '-')}</code> · {report.wall_time_s:.1f} s ·"
        f" {len(report.errors)} error(s)</p>"
    )
    return f"<div id='doctor-findings'>{head}<ol>{''.join(items)}</ol></div>"
