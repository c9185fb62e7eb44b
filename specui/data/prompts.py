"""Prompt sets as data: a registry of named sets plus user JSONL files.

A prompt set is a name, a loader and a deterministic train / held-out eval
split (lm-eval-harness style).  Adding a set is one decorated function in
``specui/data/sets.py`` (or anywhere that is imported); nothing else changes.

Splits are decided by hashing a *split key* -- the HumanEval task id, the
GSM-Symbolic template, or the row's content for JSONL files -- so a prompt (and
for generated sets, every prompt of the same template) lands in the same split
on every machine and every run, and the two splits can never share content.

JSONL rows carry one of:

* ``prompt``: plain text, sent through the verifier's chat template;
* ``messages``: a chat (``[{"role": ..., "content": ...}, ...]``);
* ``prompt_ids``: pre-tokenized prompt ids (verifiers without a tokenizer),

optionally ``id`` and ``response_ids`` (a ready-made response: self-distillation
skips such rows).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import logging
import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from specui.errors import SpecUIError
from specui.registry import Registry

if TYPE_CHECKING:  # torch and transformers load with it; prompt files need neither
    from specui.verifier.model import Verifier

log = logging.getLogger(__name__)

SPLITS = ("train", "eval", "all")
DEFAULT_EVAL_FRACTION = 0.2
# The longest prompt text accepted anywhere (CLI, API, dashboard, prompt files), in
# characters: ~50k tokens, more than the context window of any verifier SpecUI drives,
# so the cap only stops megabytes from reaching the tokenizer and the store.  The
# verifier's own window is checked in tokens when the prompt is encoded.
MAX_PROMPT_CHARS = 200_000


def check_prompt_text(text: object, what: str = "the prompt") -> str:
    """``text`` if it is usable prompt text, else one SpecUIError saying why."""
    if not isinstance(text, str):
        raise SpecUIError(f"{what} must be text, got {type(text).__name__}")
    if not text.strip():
        raise SpecUIError(f"{what} is empty")
    if len(text) > MAX_PROMPT_CHARS:
        raise SpecUIError(f"{what} has {len(text):,} characters; the limit is {MAX_PROMPT_CHARS:,}")
    if "\x00" in text:
        raise SpecUIError(f"{what} contains NUL bytes (binary data?)")
    try:
        text.encode("utf-8")
    except (
        UnicodeEncodeError
    ):  # lone surrogates: undecodable bytes from argv or a "\ud800" JSON escape
        raise SpecUIError(f"{what} is not valid UTF-8 text") from None
    return text


def encode_text(verifier: Verifier, text: str, chat: bool) -> list[int]:
    """Token ids of prompt ``text`` (checked as above), refusing text that is only special tokens.

    "<|im_end|>" typed as a prompt becomes control tokens, not text: wrapped in the
    chat template it forges a turn, bare it asks the model to continue markup.  Token
    ids (``prompt_ids``) remain the way to feed special tokens on purpose.
    """
    check_prompt_text(text)
    tok = verifier.tokenizer
    if tok is not None:
        raw = tok.encode(text, add_special_tokens=False)
        special = set(getattr(tok, "all_special_ids", ()) or ())
        if raw and all(t in special for t in raw):
            raise SpecUIError(
                f"the prompt is only special tokens ({text.strip()[:80]!r}); give some text, "
                "or token ids to feed special tokens on purpose"
            )
    return verifier.encode(text, chat=chat)


@dataclass(frozen=True)
class Prompt:
    """One prompt: exactly one of ``text``, ``messages`` or ``token_ids`` is set."""

    id: str
    source: str  # the set name or file path it came from
    text: str | None = None
    messages: tuple[dict, ...] | None = None
    token_ids: tuple[int, ...] | None = None
    response_ids: tuple[int, ...] | None = None  # pre-made response (skips self-distillation)
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        given = sum(x is not None for x in (self.text, self.messages, self.token_ids))
        if given != 1:
            raise ValueError(f"prompt {self.id}: give exactly one of text, messages, token_ids")

    @property
    def content_hash(self) -> str:
        """sha256 of the prompt content (not the id): equal content, equal hash."""
        if self.text is not None:
            payload: object = {"text": self.text}
        elif self.messages is not None:
            payload = {"messages": list(self.messages)}
        else:
            payload = {"token_ids": list(self.token_ids or ())}
        return _sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False))

    def encode(self, verifier) -> list[int]:
        """Token ids of the prompt for ``verifier`` (chat template for text/messages)."""
        if self.token_ids is not None:
            return list(self.token_ids)
        if verifier.tokenizer is None:
            raise SpecUIError(
                f"verifier {verifier.name} has no tokenizer: prompt {self.id} needs 'prompt_ids'"
                " (token ids)"
            )
        if self.messages is not None:
            return verifier.encode_messages(list(self.messages))
        return encode_text(verifier, self.text, chat=True)

    def preview(self, width: int = 80) -> str:
        if self.text is not None:
            s = self.text
        elif self.messages is not None:
            s = self.messages[-1].get("content", "")
        else:
            s = " ".join(str(t) for t in (self.token_ids or ())[:20])
        s = " ".join(s.split())
        return s if len(s) <= width else s[: width - 3] + "..."


# --- splits --------------------------------------------------------------------------


def _sha256(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def split_of(key: str, eval_fraction: float = DEFAULT_EVAL_FRACTION) -> str:
    """``"eval"`` or ``"train"`` for a split key, the same everywhere (no RNG state)."""
    bucket = int(_sha256("specui-split:" + key)[:8], 16) / 0x1_0000_0000  # uniform in [0, 1)
    return "eval" if bucket < eval_fraction else "train"


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise SpecUIError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")


# --- registry --------------------------------------------------------------------------

# loader(split, limit) -> prompts of that split, in a fixed order
Loader = Callable[[str, int | None], list[Prompt]]


@dataclass(frozen=True)
class PromptSet:
    name: str
    description: str
    loader: Loader
    # An evaluation set (Spec-Bench): never trained on, whole or in part (see
    # check_training_prompts).
    evaluation_only: bool = False


# The built-in sets register when specui.data.sets is imported, on first use.
PROMPT_SETS: Registry[PromptSet] = Registry(
    "prompt set",
    modules=["specui.data.sets"],
    describe=lambda ps: f"by {ps.loader.__module__}.{ps.loader.__qualname__}",
)


def register_prompt_set(
    name: str, description: str, evaluation_only: bool = False
) -> Callable[[Loader], Loader]:
    """Decorator: register ``loader(split, limit)`` as the prompt set ``name``.

    ``evaluation_only`` sets are refused by every training path, and so is any
    training prompt whose text contains one of their prompts.
    """

    def wrap(fn: Loader) -> Loader:
        PROMPT_SETS.register(name, PromptSet(name, description, fn, evaluation_only))
        return fn

    return wrap


def prompt_sets() -> dict[str, PromptSet]:
    """Every registered set by name (the built-in ones are registered on first use)."""
    return dict(PROMPT_SETS.items())


def training_prompt_sets() -> list[str]:
    """The registered sets a drafter may train on (evaluation-only ones are refused), sorted."""
    return sorted(name for name, ps in PROMPT_SETS.items() if not ps.evaluation_only)


def load_prompts(
    name_or_path: str | Path, split: str = "eval", limit: int | None = None
) -> list[Prompt]:
    """Prompts of a registered set or a JSONL file, one split, at most ``limit``.

    ``a,b`` mixes sets (or files): their prompts alternate, so every prefix holds
    each source about equally (a training run's ``--num-prompts`` takes a prefix).
    """
    check_split(split)
    if limit is not None and limit < 0:
        raise SpecUIError(f"limit must be >= 0, got {limit}")
    name = str(name_or_path)
    sources = mix_sources(name)
    if split == "train":
        refuse_evaluation_sets(sources)
    if len(sources) > 1:
        loaded = [load_prompts(source, split, limit) for source in sources]
        mixed = [p for round_ in itertools.zip_longest(*loaded) for p in round_ if p is not None]
        return mixed[:limit] if limit is not None else mixed
    sets = prompt_sets()
    if name in sets:
        prompts = sets[name].loader(split, limit)
    else:
        path = Path(name).expanduser()
        if not path.is_file():
            raise SpecUIError(
                f"no prompt set or file named {name!r}; known sets: {', '.join(sorted(sets))}, "
                "or give a .jsonl file"
            )
        prompts = split_prompts(read_prompt_file(path), split)
    prompts = prompts[:limit] if limit is not None else prompts
    if split == "train":
        check_training_prompts(prompts, name)
    return prompts


# --- evaluation data stays evaluation data ----------------------------------------------


def normalize_text(text: str) -> str:
    """The form in which two prompts count as the same: NFKC, lower case, words only."""
    return " ".join(re.findall(r"\w+", unicodedata.normalize("NFKC", text).lower()))


_WINDOW = 8  # words: an evaluation prompt is found inside a longer text by its first 8 words


@functools.cache
def _evaluation_index() -> tuple[dict[str, list[tuple[str, str]]], frozenset[str]]:
    """Every evaluation-only prompt, normalised: by its first words (for containment) and whole."""
    heads: dict[str, dict[str, str]] = {}
    short: set[str] = set()
    for ps in PROMPT_SETS.values():
        if not ps.evaluation_only:
            continue
        for p in ps.loader("all", None):
            for norm in {normalize_text(t) for t in prompt_texts(p)}:
                words = norm.split()
                if len(words) < _WINDOW:
                    short.add(norm)
                else:
                    heads.setdefault(" ".join(words[:_WINDOW]), {}).setdefault(norm, p.id)
    return {h: list(v.items()) for h, v in heads.items()}, frozenset(short)


def prompt_texts(p: Prompt) -> list[str]:
    """The text a prompt holds: its text, or every turn's content."""
    if p.text is not None:
        return [p.text]
    return [m.get("content", "") for m in p.messages or () if isinstance(m.get("content"), str)]


def refuse_evaluation_sets(sources: Iterable[str]) -> None:
    """Refuse an evaluation-only set named among training ``sources`` (one clear message)."""
    sets = prompt_sets()
    for source in sources:
        if source in sets and sets[source].evaluation_only:
            raise SpecUIError(
                f"{source} is an evaluation set: training on it would make its benchmark numbers "
                "meaningless. Train on other prompts (e.g. general, gsm-symbolic) and bench on it."
            )


def check_training_prompts(prompts: Iterable[Prompt], name: str = "the training prompts") -> None:
    """Refuse training data that is, or contains, an evaluation-only prompt (Spec-Bench).

    A drafter trained on the questions it is scored on reports an acceptance no user
    sees.  Checked on normalised text, so case, punctuation and spacing changes, or
    the question pasted inside a longer prompt, are caught too.
    """
    refuse_evaluation_sets(mix_sources(str(name)))
    heads, short = _evaluation_index()
    if not heads and not short:
        return
    hits: list[tuple[str, str]] = []
    for p in prompts:
        for text in prompt_texts(p):
            norm = normalize_text(text)
            if norm in short:
                hits.append((p.id, "an evaluation prompt"))
                continue
            words = norm.split()
            for i in range(max(0, len(words) - _WINDOW + 1)):
                for full, where in heads.get(" ".join(words[i : i + _WINDOW]), ()):
                    if full in norm:
                        hits.append((p.id, where))
                        break
                else:
                    continue
                break
    if hits:
        first_id, where = hits[0]
        raise SpecUIError(
            f"{name}: {len(hits)} training prompt(s) contain an evaluation-only prompt (first:"
            f" {first_id}, which contains {where}); remove them, evaluation data must never be"
            " trained on"
        )


def mix_sources(name: str) -> list[str]:
    """The sets (or files) a name mixes: ``a,b`` -> [a, b]; anything else -> [name]."""
    if "," not in name or Path(name).expanduser().is_file():  # a file may have a comma in its name
        return [name]
    sources = [part.strip() for part in name.split(",")]
    if not all(sources):
        raise SpecUIError(f"empty prompt set name in {name!r}")
    return sources


def bench_split(name: str) -> str:
    """The split a benchmark scores: a registered set's held-out split, a user's file whole.

    A mix (``a,b``) must be all sets or all files: one split applies to every source,
    and a file's held-out part, or a set's training part, would be scored unnoticed.
    """
    registered = [source in prompt_sets() for source in mix_sources(str(name))]
    if all(registered):
        return "eval"
    if not any(registered):
        return "all"
    raise SpecUIError(f"{name!r} mixes prompt sets and files; benchmark them separately")


def split_prompts(
    prompts: Iterable[Prompt], split: str, eval_fraction: float = DEFAULT_EVAL_FRACTION
) -> list[Prompt]:
    """The prompts of one split, keyed by content (duplicates land together)."""
    check_split(split)
    if split == "all":
        return list(prompts)
    return [p for p in prompts if split_of(p.content_hash, eval_fraction) == split]


# --- JSONL files -----------------------------------------------------------------------


@dataclass
class FileProblem:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def read_prompt_file(
    path: str | Path, problems: list[FileProblem] | None = None, source: str | None = None
) -> list[Prompt]:
    """All usable rows of a JSONL prompt file (duplicates dropped).

    Broken lines are logged with their line number (and appended to ``problems``
    when given) and skipped; a file with no usable row raises SpecUIError.
    """
    path = Path(path)
    found: list[FileProblem] = []
    prompts: list[Prompt] = []
    seen: set[str] = set()
    try:
        raw_lines = path.read_bytes().splitlines()
    except OSError as e:
        raise SpecUIError(f"cannot read prompt file {path}: {e.strerror or e}") from None
    for lineno, raw in enumerate(raw_lines, start=1):
        # Decoded line by line: one line of stray bytes costs that line, not the file.
        try:
            line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as e:
            found.append(
                FileProblem(
                    lineno, f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
                )
            )
            continue
        if not line.strip():
            continue
        try:
            p = _parse_row(line, lineno, source or str(path))
        except ValueError as e:
            found.append(FileProblem(lineno, str(e)))
            continue
        if p.content_hash in seen:
            continue  # a duplicate adds nothing and would double its weight
        seen.add(p.content_hash)
        prompts.append(p)
    for prob in found:
        log.warning("%s: %s (skipped)", path, prob)
    if problems is not None:
        problems.extend(found)
    if not prompts:
        detail = f"; first problem: {found[0]}" if found else " (the file is empty)"
        raise SpecUIError(
            f"prompt file {path} has no usable rows: each line must be a JSON object with "
            f"'prompt' (text), 'messages' (a chat) or 'prompt_ids' (token ids){detail}"
        )
    return prompts


def _parse_row(line: str, lineno: int, source: str) -> Prompt:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise ValueError("not a JSON object")
    pid = str(row.get("id", f"line-{lineno}"))
    response = row.get("response_ids")
    if response is not None:
        response = tuple(_token_list(response, "response_ids"))
    kinds = [k for k in ("prompt", "messages", "prompt_ids") if k in row]
    if len(kinds) != 1:
        raise ValueError("needs exactly one of 'prompt', 'messages', 'prompt_ids'")
    kind = kinds[0]
    if kind == "prompt":
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise ValueError("'prompt' must be a non-empty string")
        _check_row_text(row["prompt"], "'prompt'")
        return Prompt(pid, source, text=row["prompt"], response_ids=response)
    if kind == "messages":
        msgs = row["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise ValueError("'messages' must be a non-empty list")
        for m in msgs:
            if not (
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
            ):
                raise ValueError("each message needs string 'role' and 'content'")
        _check_row_text("".join(m["content"] for m in msgs), "'messages'")
        return Prompt(
            pid,
            source,
            messages=tuple({"role": m["role"], "content": m["content"]} for m in msgs),
            response_ids=response,
        )
    ids = _token_list(row["prompt_ids"], "prompt_ids")
    if not ids:
        raise ValueError("'prompt_ids' is empty")
    return Prompt(pid, source, token_ids=tuple(ids), response_ids=response)


def _check_row_text(text: str, what: str) -> None:
    try:
        check_prompt_text(text, what)
    except SpecUIError as e:
        raise ValueError(str(e)) from None


def _token_list(value: object, name: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise ValueError(f"'{name}' must be a list of non-negative integers")
    return list(value)


def write_prompt_file(path: str | Path, prompts: Iterable[Prompt]) -> Path:
    """Write prompts as JSONL rows that ``read_prompt_file`` reads back."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for p in prompts:
            row: dict = {"id": p.id}
            if p.text is not None:
                row["prompt"] = p.text
            elif p.messages is not None:
                row["messages"] = list(p.messages)
            else:
                row["prompt_ids"] = list(p.token_ids or ())
            if p.response_ids is not None:
                row["response_ids"] = list(p.response_ids)
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
