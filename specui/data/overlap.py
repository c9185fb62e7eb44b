"""Content that two prompt splits share: runs of ``RUN`` words that only a few prompts hold.

A split key keeps a prompt and its exact duplicates on one side, but generated corpora reuse
text under different requests: the campaign builds 20-60 prompts (a summary, a question, an
extraction, a RAG bundle) on each long passage, and a second turn carries its first turn and
the verifier's answer to it.  A held-out prompt whose passage a training prompt also holds is not
held out: the drafter has learned that passage's continuations, and its held-out acceptance then
says nothing about a user's document.  So content is compared as runs of words, normalised as
``normalize_text`` does, and a run that more than ``BOILERPLATE`` prompts of the corpus hold is a
template's wording ("Answer the question using the search results below ..."), which every split
may share.  In the campaign's corpus a passage's runs are in at most 65 prompts, a template's in
150 or more.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from specui.data.prompts import Prompt, normalize_text, prompt_texts

RUN = 10  # words: longer than any phrase two unrelated requests share by chance
BOILERPLATE = 100  # prompts of the corpus: a run in more of them is a template's, not content


def runs(p: Prompt) -> set[int]:
    """Hashes of every ``RUN``-word run of the prompt's text (all turns), normalised."""
    out: set[int] = set()
    for text in prompt_texts(p):
        words = normalize_text(text).split()
        out.update(hash(" ".join(words[i : i + RUN])) for i in range(len(words) - RUN + 1))
    return out


def shared_content(
    corpus: Sequence[Prompt],
    candidates: Sequence[int],
    held_out: Sequence[int],
    boilerplate: int = BOILERPLATE,
) -> set[int]:
    """The ``candidates`` (indices into ``corpus``) that share content with a ``held_out`` one:
    a run both hold that at most ``boilerplate`` prompts of ``corpus`` hold."""
    held: set[int] = set().union(*(runs(corpus[i]) for i in held_out))
    # Only the held-out runs each prompt holds are kept: a few per prompt, where all of a
    # corpus's runs (millions, for long documents) would be held at once in every process.
    touched = [runs(p) & held for p in corpus]
    count = Counter(r for rs in touched for r in rs)
    content = {r for r, n in count.items() if n <= boilerplate}
    return {i for i in candidates if touched[i] & content}
