"""Running ``specui`` in-process and checking its one-line errors (the bad-input tests and
every other file that checks a refusal)."""

from __future__ import annotations

from specui.cli import main


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """``specui ARGS`` in-process: (exit code, stdout, stderr); argparse's exits included."""
    try:
        rc = main(list(args))
    except SystemExit as e:  # argparse refuses before main's own handler runs
        rc = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_error(rc: int, err: str, fragment: str) -> None:
    """Exit 2, one ``specui: error: ...`` line holding ``fragment``, no traceback."""
    assert rc == 2, (rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("specui: error: "), err
    assert "Traceback" not in err
    assert fragment in lines[0], (fragment, lines[0])
