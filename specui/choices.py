"""What a dashboard visitor picked or typed where a name or a path is accepted.

The dashboard's three kinds of "name or path" inputs -- a verifier, a speculator, a prompt
set -- each checked against the names the library knows, anything else confined to the
app's folders (``specui.paths.confine_choice``).  The CLI does not call these: the
operator may name any path.
"""

from __future__ import annotations

from specui.algorithms.resolve import BUILTIN, shipped_drafters
from specui.data import prompt_sets
from specui.data.prompts import mix_sources
from specui.paths import confine_choice, is_hub_id
from specui.verifier.hub import check_hub_allowed


def ui_verifier(choice: str) -> str:
    """A verifier a visitor chose: ``embedded``, a folder / .gguf in the app's folders, or a
    hub id the operator allows (``specui.verifier.hub``; its size is admitted by the load)."""
    return _hub_checked(confine_choice(choice, ("embedded",), hub_ids=True), "verifier")


def ui_drafter(choice: str) -> str:
    """A drafter a visitor chose: ``none``, ``ngram``, a shipped name, a speculator folder
    in the app's folders, or a hub id the operator allows."""
    names = ("", "plain", *BUILTIN, *shipped_drafters())
    return _hub_checked(confine_choice(choice, names, hub_ids=True), "speculator")


def _hub_checked(value: str, kind: str) -> str:
    # confine_choice returns a path resolved (absolute), a known name, or a hub id unchanged.
    if is_hub_id(value):
        check_hub_allowed(value, kind)
    return value


def ui_prompts(name: str) -> str:
    """A prompt set a visitor chose: a registered set, a mix of them (``a,b``), or a JSONL
    file in the app's folders."""
    parts = mix_sources(name or "")
    if len(parts) > 1 and all(part in prompt_sets() for part in parts):
        return ",".join(parts)
    return confine_choice(name, prompt_sets())
