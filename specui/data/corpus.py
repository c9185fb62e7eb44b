"""The general-purpose training corpus: many kinds of request, built offline.

Sources, each a function returning rows ``{"id", "prompt", "kind", "source"}``:

* ``magpie``: user turns the verifier wrote itself (``specui.data.magpie``), under
  system prompts that steer the kind (chat, advice, writing, code, math, ...);
* ``text_tasks``: summarising, extracting, answering about, rewriting and
  translating a given passage: paragraphs of the Python documentation (Debian's
  ``python3-doc``, PSF licence) and Spanish and Italian quotations (Debian's
  ``fortunes-es`` and ``fortunes-it``, public domain) as the passages;
* ``code_tasks``: "write a function" requests from the standard library's own
  docstrings;
* the training splits of the registered sets (GSM-Symbolic, rg-math, HumanEval,
  and reasoning-gym's logic and string puzzles).

``build`` mixes them, drops duplicates (normalised text) and anything that
contains an evaluation-only prompt, and the result ships as
``data/corpus/general.jsonl``, the ``general`` prompt set.  Every choice is
seeded, so the same inputs give the same file.
"""

from __future__ import annotations

import inspect
import random
import re
from collections.abc import Iterable
from pathlib import Path

from specui.data.prompts import check_training_prompts, load_prompts, normalize_text
from specui.errors import SpecUIError

PY_DOCS = Path("/usr/share/doc/python3.11/html/_sources")
FORTUNES = Path("/usr/share/games/fortunes")

Row = dict[str, str]


def _row(source: str, i: int, kind: str, prompt: str) -> Row:
    return {"id": f"{source}/{i}", "prompt": prompt, "kind": kind, "source": source}


# --- passages -------------------------------------------------------------------------

_RST_MARKUP = re.compile(r":[a-z]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")


def doc_paragraphs(root: Path = PY_DOCS, min_words: int = 40, max_words: int = 220) -> list[str]:
    """Prose paragraphs of the Python documentation's reST sources, markup stripped."""
    if not root.is_dir():
        raise SpecUIError(
            f"{root} not found: install Debian's python3-doc (apt-get install python3-doc)"
        )
    out: list[str] = []
    for path in sorted(root.rglob("*.rst.txt")):
        out.extend(rst_paragraphs(path, min_words, max_words))
    return out


def rst_paragraphs(path: Path, min_words: int, max_words: int) -> list[str]:
    """One reST source file's prose paragraphs, in order, markup stripped."""
    out: list[str] = []
    for block in re.split(r"\n\s*\n", path.read_text(encoding="utf-8", errors="replace")):
        lines = block.strip().splitlines()
        # Prose only: no directives, tables, literal blocks, headings or indented code.
        if not lines or any(
            ln.startswith((" ", "\t", "..", "=", "-", "*", "+", "|", ">>>")) for ln in lines
        ):
            continue
        text = " ".join(ln.strip() for ln in lines)
        text = _RST_MARKUP.sub(r"\1", text).replace("``", "").replace("**", "").replace("::", ":")
        if text.endswith(":") or "`" in text:
            continue
        if min_words <= len(text.split()) <= max_words:
            out.append(text)
    return out


def fortunes(
    lang: str, root: Path = FORTUNES, min_words: int = 6, max_words: int = 120
) -> list[str]:
    """Quotations of one language folder of Debian's fortunes (``es``, ``it``), one per entry."""
    folder = root / lang
    if not folder.is_dir():
        raise SpecUIError(f"{folder} not found: install Debian's fortunes-{lang}")
    out: list[str] = []
    for path in sorted(folder.iterdir()):
        if path.suffix in (".dat", ".u8") or not path.is_file():
            continue
        for entry in path.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            text = " ".join(entry.split())
            if min_words <= len(text.split()) <= max_words and "\ufffd" not in text:
                out.append(text)
    return out


# --- templated requests ---------------------------------------------------------------

SUMMARIZE = (
    "Summarize: {p}",
    "Summarize the following text in two or three sentences.\n\n{p}",
    "Give a one-sentence summary of this paragraph:\n\n{p}",
    "Write a short summary of the passage below for a beginner.\n\n{p}",
    "TL;DR: {p}",
)
EXTRACT = (
    "Extract the key facts from this text as a bulleted list.\n\n{p}",
    "List the technical terms used in the following paragraph and explain each briefly.\n\n{p}",
    "What are the main points of this passage?\n\n{p}",
    "Read the text and write three questions it answers, with their answers.\n\n{p}",
)
ANSWER = (
    (
        "Use the passage to answer the question.\n\nPassage: {p}\n\nQuestion: What is this passage"
        " mainly about?"
    ),
    "Context: {p}\n\nBased on the context above, what should a programmer remember from it?",
    (
        "Document: {p}\n\nAnswer using only the document: what problem does it describe, and what"
        " is the solution?"
    ),
    "Here is some documentation:\n{p}\n\nExplain it to someone who is new to Python.",
)
REWRITE = (
    "Rewrite the following paragraph in simpler words.\n\n{p}",
    "Make this text more concise without losing information:\n\n{p}",
    "Rewrite this paragraph as a friendly email to a colleague.\n\n{p}",
)
TO_ENGLISH = (
    "Translate {lang} to English: {p}",
    "Translate this {lang} text into English:\n\n{p}",
    'What does this {lang} quote mean in English? "{p}"',
)
FROM_ENGLISH = (
    "Translate English to {lang}: {p}",
    "Translate the following sentence into {lang}: {p}",
)


def text_tasks(seed: int = 0, n_docs: int = 1600, n_quotes: int = 500) -> list[Row]:
    """Requests about a given passage: summarise, extract, answer, rewrite, translate."""
    rng = random.Random(seed)
    paragraphs = doc_paragraphs()
    rng.shuffle(paragraphs)
    rows: list[Row] = []
    groups = ((SUMMARIZE, "summarize"), (EXTRACT, "extract"), (ANSWER, "rag"), (REWRITE, "rewrite"))
    for i, p in enumerate(paragraphs[:n_docs]):
        templates, kind = groups[i % len(groups)]
        rows.append(_row("pydocs", i, kind, rng.choice(templates).format(p=p)))
    for i, p in enumerate(paragraphs[n_docs : n_docs + n_quotes // 3]):
        sentence = re.split(r"(?<=[.!?])\s", p)[0]
        lang = rng.choice(("French", "German", "Spanish"))
        rows.append(
            _row(
                "pydocs-translate",
                i,
                "translate",
                rng.choice(FROM_ENGLISH).format(lang=lang, p=sentence),
            )
        )
    quotes = [("Spanish", q) for q in fortunes("es")] + [("Italian", q) for q in fortunes("it")]
    rng.shuffle(quotes)
    for i, (lang, q) in enumerate(quotes[:n_quotes]):
        rows.append(_row("fortunes", i, "translate", rng.choice(TO_ENGLISH).format(lang=lang, p=q)))
    return rows


CODE = (
    "Write a Python function `{name}{sig}` that does the following: {doc}",
    "Implement `{name}{sig}` in plain Python without importing `{module}`. {doc}",
    (
        "Explain what `{module}.{name}` does and show a short example of using it. Its"
        " documentation says: {doc}"
    ),
    "Write a unit test for a function `{name}{sig}`, which should behave like this: {doc}",
)
_CODE_MODULES = (
    "os.path",
    "string",
    "textwrap",
    "itertools",
    "functools",
    "statistics",
    "math",
    "bisect",
    "heapq",
    "shutil",
    "json",
    "re",
    "collections",
    "datetime",
    "random",
    "fnmatch",
    "difflib",
    "html",
    "base64",
    "urllib.parse",
    "operator",
    "calendar",
    "copy",
    "glob",
    "zlib",
    "csv",
    "secrets",
    "ipaddress",
)


def code_tasks(seed: int = 0, limit: int = 500) -> list[Row]:
    """Programming requests made from the standard library's public functions and their
    docstrings."""
    import importlib

    rng = random.Random(seed)
    found = []
    for module_name in _CODE_MODULES:
        module = importlib.import_module(module_name)
        for name, fn in sorted(vars(module).items()):
            if name.startswith("_") or not callable(fn) or inspect.isclass(fn):
                continue
            doc = inspect.getdoc(fn) or ""
            first = " ".join(doc.split("\n\n")[0].split())
            try:
                sig = str(inspect.signature(fn))
            except (TypeError, ValueError):
                continue
            if 6 <= len(first.split()) <= 80 and len(sig) < 80:
                found.append((module_name, name, sig, first))
    rng.shuffle(found)
    rows = []
    for i, (module, name, sig, doc) in enumerate(found[:limit]):
        rows.append(
            _row(
                "stdlib-code",
                i,
                "code",
                rng.choice(CODE).format(module=module, name=name, sig=sig, doc=doc),
            )
        )
    return rows


# reasoning-gym tasks that are logic, language or string puzzles rather than arithmetic.
REASONING_TASKS = (
    "syllogism",
    "propositional_logic",
    "knights_knaves",
    "letter_counting",
    "word_sorting",
    "spell_backward",
    "sentence_reordering",
    "word_sequence_reversal",
    "caesar_cipher",
    "letter_jumble",
    "group_anagrams",
    "isomorphic_strings",
    "ransom_note",
    "number_sequence",
    "base_conversion",
    "course_schedule",
    "zebra_puzzles",
    "self_reference",
)
REASONING_SEED = 20261201


def reasoning_tasks(per_task: int = 40) -> list[Row]:
    import reasoning_gym

    rows = []
    for task in REASONING_TASKS:
        ds = reasoning_gym.create_dataset(task, size=per_task, seed=REASONING_SEED)
        rows.extend(_row(f"rg-{task}", i, "reasoning", ds[i]["question"]) for i in range(per_task))
    return rows


def registered(name: str, kind: str, limit: int) -> list[Row]:
    """The training split of a registered set, as corpus rows (their held-out splits stay out)."""
    return [
        {"id": p.id, "prompt": p.text, "kind": kind, "source": name}
        for p in load_prompts(name, split="train", limit=limit)
        if p.text is not None
    ]


def magpie_rows(kept: Iterable[dict]) -> list[Row]:
    return [_row(f"magpie-{r['kind']}", i, r["kind"], r["text"]) for i, r in enumerate(kept)]


def build(sources: Iterable[list[Row]], seed: int = 0) -> list[Row]:
    """Mix the sources (shuffled, seeded), without duplicates or evaluation prompts."""
    from specui.data.prompts import Prompt

    rows = [r for src in sources for r in src]
    random.Random(seed).shuffle(rows)
    seen: set[str] = set()
    out: list[Row] = []
    for r in rows:
        key = normalize_text(r["prompt"])
        if key and key not in seen:
            seen.add(key)
            out.append(r)
    # Fails loudly rather than filtering: a contaminated source should be fixed at its source.
    check_training_prompts(
        [Prompt(r["id"], r["source"], text=r["prompt"]) for r in out], "the general corpus"
    )
    return out
