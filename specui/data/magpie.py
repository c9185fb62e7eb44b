"""Self-instruct in the Magpie style: the verifier writes the user turns itself.

An instruct model fed its chat template up to the start of a user turn (and no
text) continues with something a user might say.  Sampling that many times and
keeping the distinct, well-formed results gives a prompt set in the verifier's
own distribution, with no data set at all (Xu et al., "Magpie", 2024).

The raw samples are appended to a JSONL cache batch by batch, each batch seeded
by its index, so a killed run resumes where it stopped and a finished run is
reproducible.  ``filter_user_turns`` then deduplicates and filters them.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from specui.atomic import write_text
from specui.data.prompts import normalize_text
from specui.errors import SpecUIError

Progress = Callable[[int, int], None]  # (samples done, samples wanted)

_MARK = "\x00MAGPIE\x00"


# System prompts that steer what kind of request the sampled user writes (Magpie's
# "filtered by task" variant): one kind per batch, in turn.  ``None`` is the
# template's own default system prompt.
KINDS: dict[str, str | None] = {
    "chat": None,
    "advice": (
        "You are a friendly assistant who gives practical advice on everyday life, work, health and"
        " travel."
    ),
    "writing": (
        "You are a writing assistant. Users ask you to write stories, poems, emails, essays,"
        " slogans and blog posts."
    ),
    "code": (
        "You are a programming assistant. Users ask you to write, explain and fix code in Python,"
        " JavaScript, SQL and other languages."
    ),
    "math": (
        "You are a math tutor. Users ask you to solve arithmetic, algebra, geometry and word"
        " problems step by step."
    ),
    "reasoning": (
        "You are a careful thinker. Users give you logic puzzles, riddles and questions that need"
        " step-by-step reasoning."
    ),
    "knowledge": (
        "You are an expert teacher. Users ask you to explain concepts in science, history,"
        " economics and technology."
    ),
    "text": (
        "You are a language assistant. Users paste a text and ask you to summarize it, extract"
        " facts from it, rewrite it or translate it."
    ),
}


def user_prefix_ids(verifier, system: str | None = None) -> list[int]:
    """Token ids of the chat template up to where a user turn's text starts."""
    tok = verifier.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise SpecUIError(f"verifier {verifier.name} has no chat template: Magpie needs one")
    messages = [{"role": "user", "content": _MARK}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    if _MARK not in text:
        raise SpecUIError(f"verifier {verifier.name}'s chat template drops the user's text")
    prefix = text[: text.index(_MARK)]
    return list(tok.encode(prefix, add_special_tokens=False))


def end_of_turn_ids(verifier) -> set[int]:
    """Tokens that end a user turn: the template's end-of-turn marker and EOS."""
    ids = set(verifier.eos_token_ids)
    tok = verifier.tokenizer
    for name in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>"):
        tid = tok.convert_tokens_to_ids(name) if tok is not None else None
        if isinstance(tid, int) and tid != getattr(tok, "unk_token_id", None):
            ids.add(tid)
    return ids


def read_samples(path: Path) -> list[dict]:
    """The cached raw samples (a torn last line from a crash is dropped)."""
    rows: list[dict] = []
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


@torch.inference_mode()
def sample_user_turns(
    verifier,
    n: int,
    cache_path: str | Path,
    batch_size: int = 32,
    max_new_tokens: int = 96,
    temperature: float = 1.0,
    min_p: float = 0.05,
    seed: int = 0,
    kinds: dict[str, str | None] | None = None,
    progress: Progress | None = None,
) -> list[dict]:
    """At least ``n`` raw user turns sampled from the empty user prefix (cached, resumable).

    Rows: ``{"batch": b, "kind": k, "text": ..., "complete": bool}``; ``complete``
    is false when the turn ran into ``max_new_tokens`` without ending.  Batch
    ``b`` uses the ``b % len(kinds)``-th system prompt.  ``min_p`` (not top-p,
    which sorts the whole vocabulary every step) cuts the junk tail.
    """
    path = Path(cache_path)
    rows = _complete_batches(path, batch_size)
    done_batches = {r["batch"] for r in rows}
    kinds = KINDS if kinds is None else kinds
    kind_names = list(kinds)
    prefixes = {
        k: torch.tensor(user_prefix_ids(verifier, kinds[k]), dtype=torch.long) for k in kind_names
    }
    stop = end_of_turn_ids(verifier)
    tok = verifier.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(stop)
    batch = 0
    if progress:
        progress(len(rows), n)
    while len(rows) < n:
        if batch in done_batches:
            batch += 1
            continue
        # One seed per batch: a resumed run draws what the first one would have.
        torch.manual_seed(seed * 1_000_003 + batch)
        kind = kind_names[batch % len(kind_names)]
        prefix = prefixes[kind]
        ids = prefix.repeat(batch_size, 1)  # same prefix in every row: no padding needed
        out = verifier.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=True,
            temperature=temperature,
            min_p=min_p,
            top_p=1.0,
            top_k=0,
            pad_token_id=pad,
            eos_token_id=sorted(stop),
        )
        new = []
        for row in out[:, prefix.numel() :].tolist():
            cut = next((i for i, t in enumerate(row) if t in stop), None)
            body = row if cut is None else row[:cut]
            new.append(
                {
                    "batch": batch,
                    "kind": kind,
                    "text": tok.decode(body, skip_special_tokens=True),
                    "complete": cut is not None,
                }
            )
        _append(path, new)
        rows.extend(new)
        batch += 1
        if progress:
            progress(len(rows), n)
    return rows


def _complete_batches(path: Path, batch_size: int) -> list[dict]:
    """The cached rows of whole batches; the file is rewritten without a crash's remains.

    A run killed mid-append leaves part of a batch and perhaps a torn last line: the
    part would mark its batch done, and the next append would glue onto the torn line."""
    rows = read_samples(path)
    sizes = Counter(r["batch"] for r in rows)
    if sizes and max(sizes.values()) != batch_size:
        # Another batch size draws other samples per seed: refuse rather than drop the file's
        # batches.
        raise SpecUIError(
            f"{path} was sampled {max(sizes.values())} turns per batch; resume it with that "
            f"batch size (not {batch_size}), or use another file"
        )
    whole = [r for r in rows if sizes[r["batch"]] == batch_size]
    if path.is_file() and (len(whole) != len(rows) or not path.read_bytes().endswith(b"\n")):
        write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in whole))
    return whole


def _append(path: Path, rows: Iterable[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


_ROLE_LEAK = re.compile(
    r"<\|im_|\bassistant\s*:|\buser\s*:|^\s*(sure|certainly|of course)[,!. ]", re.I
)


def keep_user_turn(text: str, min_chars: int = 16, max_chars: int = 1200) -> bool:
    """A sampled turn worth keeping: ended by itself, long enough, mostly words, not an answer."""
    t = text.strip()
    if not min_chars <= len(t) <= max_chars:
        return False
    if _ROLE_LEAK.search(t):
        return False
    letters = sum(c.isalpha() for c in t)
    if letters < 0.5 * len(t):
        return False
    words = t.split()
    if len(words) < 4:
        return False
    # Degenerate loops ("the the the ...") and lists of one repeated line.
    return len(set(words)) >= 0.4 * len(words)


def filter_user_turns(rows: Iterable[dict]) -> list[dict]:
    """Distinct kept rows, first occurrence first (normalised text and first eight words)."""
    seen_full: set[str] = set()
    seen_head: set[str] = set()
    out = []
    for r in rows:
        if not r.get("complete"):
            continue
        text = r["text"].strip()
        if not keep_user_turn(text):
            continue
        norm = normalize_text(text)
        head = " ".join(norm.split()[:8])
        if norm in seen_full or head in seen_head:
            continue
        seen_full.add(norm)
        seen_head.add(head)
        out.append({**r, "text": text})
    return out
