"""A visitor's bad input is refused with one log line, not a traceback.

Gradio prints the traceback of every exception a handler raises, ``gr.Error`` included,
unless the error says not to (``print_exception=False``).  A refused input is no fault of
the server: ``refuse`` logs it as one INFO line (the endpoint and the message, which is
what the visitor sees) and returns the ``gr.Error`` to raise.  Any other exception is a
real failure and keeps Gradio's traceback.
"""

from __future__ import annotations

import logging

import gradio as gr

log = logging.getLogger("specui.ui")


def log_refusal(endpoint: str, error: BaseException | str) -> None:
    """One INFO line: ``refused ENDPOINT: MESSAGE`` (the message flattened to one line)."""
    log.info("refused %s: %s", endpoint, " ".join(str(error).split())[:500])


def refuse(endpoint: str, error: BaseException | str) -> gr.Error:
    """The ``gr.Error`` that shows ``error`` to the visitor, logged once as a refusal."""
    log_refusal(endpoint, error)
    return gr.Error(str(error), print_exception=False)
