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
from specui.paths import confine_choice


def ui_verifier(choice: str) -> str:
    """A verifier a visitor chose: ``embedded``, a hub id, or a folder / .gguf in the app's
    folders."""
    return confine_choice(choice, ("embedded",), hub_ids=True)


def ui_drafter(choice: str) -> str:
    """A drafter a visitor chose: ``none``, ``ngram``, a shipped name, or a speculator folder
    in the app's folders."""
    return confine_choice(choice, ("", "plain", *BUILTIN, *shipped_drafters()))


def ui_prompts(name: str) -> str:
    """A prompt set a visitor chose: a registered set, a mix of them (``a,b``), or a JSONL
    file in the app's folders."""
    parts = mix_sources(name or "")
    if len(parts) > 1 and all(part in prompt_sets() for part in parts):
        return ",".join(parts)
    return confine_choice(name, prompt_sets())
