"""The drafters' training campaign: many hours of generation, extraction and training on a small
machine, in stages that survive any stop.

Processes end whenever a working session does; files outside the repository usually stay.  So
the campaign keeps all its state in one folder (``SPECUI_CAMPAIGN_DIR``, default
``~/specui-campaign``), every stage appends as it goes and skips what is done, and one command
(``scripts/campaign.sh``) starts it again in the background where it stopped:

    STATE/prompts*.jsonl      the broad corpus's new prompts (``specui.data.broad``), each part
                              built once (PARTS)
    STATE/cache/              the verifier's greedy responses, one line appended per response
    STATE/train.jsonl         every training row with its response (``materialize``): the file
                              the drafters train on; its held-out split is the campaign's
    STATE/campaign.log        what each stage did, with rates
    STATE/lock                held while a campaign runs (a second one exits at once)

If the folder is gone, the campaign starts again from the committed corpus (``commit_corpus``:
the prompt parts in ``data/corpus/campaign/``, the responses in ``data/corpus/``), losing only
what had not been committed.  Stages: ``prompts``, ``generate``, ``materialize``;
hidden-state extraction and the drafters' training come next, in the same folder.
"""

from __future__ import annotations

import fcntl
import json
import logging
import lzma
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specui.data import broad
from specui.data.corpus import build
from specui.data.distill import (
    cache_name,
    cached_responses,
    prompt_key,
    read_text,
    self_distill,
    verifier_fingerprint,
)
from specui.data.prompts import Prompt, check_training_prompts, load_prompts, normalize_text
from specui.errors import SpecUIError
from specui.paths import campaign_dir, shipped_data_dir

log = logging.getLogger(__name__)

MAX_NEW_TOKENS = 256
# A prompt longer than this is cut at the front (self_distill keeps its end); none of the
# builders writes one, but a second turn after a long first answer can come close.
MAX_PROMPT_TOKENS = 2048
SEED = 49
# How many of each new kind: >= 30k prompts in all with the general corpus's 10.1k, >= 20% of
# them 500-2,000 tokens long (the long documents and long code).
COUNTS = {
    "long_documents": 6000,
    "long_code": 1200,
    "translations": 5500,
    "casual": 2500,
    "more_long_documents": 3000,
}
# Continuous batching keeps `slots` rows in flight over a KV cache as long as the longest prompt
# of the chunk: short prompts many at a time, long ones few, so the cache stays ~1-2 GB.
SHORT_TOKENS = 480
BATCH = {"short": 64, "long": 16}
CHUNK = 512  # prompts per self_distill call: a kill loses at most the responses in flight


def state_dir() -> Path:
    return campaign_dir()


@contextmanager
def campaign_lock(folder: Path, shard: tuple[int, int] = (0, 1)) -> Iterator[None]:
    """Held for a campaign's whole run: a second one (a restart while the first still runs)
    fails at once instead of generating the same responses twice.  Each shard of a sharded
    run has a lock of its own (``lock``, ``lock-1``, ...), holding its pid."""
    folder.mkdir(parents=True, exist_ok=True)
    with lock_file(folder, shard[0]).open("a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SpecUIError(f"a campaign is already running in {folder}") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield


def lock_file(folder: Path, index: int) -> Path:
    return folder / ("lock" if index == 0 else f"lock-{index}")


def shard_running(folder: Path, index: int) -> bool:
    """Whether shard ``index``'s lock is held now (its process is alive and at work)."""
    path = lock_file(folder, index)
    if not path.is_file():
        return False
    with path.open("a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return False


def _read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def row_prompt(row: dict) -> Prompt:
    """A corpus row as a Prompt: its messages where it has them (a second turn), else its text."""
    meta = {"kind": row["kind"], "source": row["source"]}
    if row.get("messages"):
        return Prompt(row["id"], "broad", messages=tuple(row["messages"]), meta=meta)
    return Prompt(row["id"], "broad", text=row["prompt"], meta=meta)


def first_turns(verifier) -> list[tuple[str, str]]:
    """The general corpus's training requests with the verifier's shipped answer to each (its
    end-of-turn token dropped), for second turns; math and puzzles left out, where a follow-up
    such as "make it shorter" is not what people ask."""
    prompts = [
        p for p in load_prompts("general", split="train") if p.meta.get("kind") not in ("math",)
    ]
    folders = [shipped_data_dir() / "corpus"]
    cache = cached_responses(verifier_fingerprint(verifier), 128, verifier.eos_token_ids, folders)
    eos = set(verifier.eos_token_ids)
    out = []
    for p in prompts:
        response = cache.get(prompt_key(p.encode(verifier)))
        if response is None or p.text is None:
            continue
        answer = verifier.tokenizer.decode([t for t in response if t not in eos]).strip()
        if answer:
            out.append((p.text, answer))
    return out


def broad_sources(verifier, seed: int = SEED) -> tuple[list[list[dict]], list[dict]]:
    """The broad corpus's single-turn sources, and its second turns (on the general corpus's
    first turns and the verifier's shipped answers)."""
    sources = [
        broad.long_documents(seed, COUNTS["long_documents"]),
        broad.long_code(seed, COUNTS["long_code"]),
        broad.translations(seed, COUNTS["translations"]),
        broad.casual(seed, COUNTS["casual"]),
    ]
    return sources, broad.second_turns(first_turns(verifier), seed)


def more_long_sources(verifier, seed: int = SEED) -> tuple[list[list[dict]], list[dict]]:
    """The second part: more long documents (other runs of the same texts, other requests), so
    that the corpus passes 30k prompts with over a fifth of them 500-2,000 tokens long."""
    rows = broad.long_documents(seed + 1, COUNTS["more_long_documents"])
    for r in rows:
        r["id"] = f"more/{r['id']}"
    return [rows], []


# Each part is built once, in this order, into its own file; later parts skip what earlier ones
# hold, so a part added in a later session leaves the earlier prompts (and responses) as they are.
PARTS: dict[str, Callable[[object, int], tuple[list[list[dict]], list[dict]]]] = {
    "prompts.jsonl": broad_sources,
    "prompts-2.jsonl": more_long_sources,
}


def build_all_prompts(verifier, folder: Path, seed: int = SEED) -> list[Path]:
    """Every part of PARTS where missing: restored from the committed corpus (a bare machine: the
    part as it was built), else built."""
    return [
        restore_part(folder, name) or build_prompts(verifier, folder, seed, sources, name)
        for name, sources in PARTS.items()
    ]


def restore_part(folder: Path, name: str) -> Path | None:
    """STATE/``name`` from its committed copy when the folder lacks it (None: no copy)."""
    path, committed = folder / name, committed_dir() / f"{name}.xz"
    if path.is_file() or not committed.is_file():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(read_text(committed), encoding="utf-8")
    tmp.replace(path)
    log.info("prompts: %s restored from %s", path, committed)
    return path


def part_paths(folder: Path) -> list[Path]:
    return [folder / name for name in PARTS]


def campaign_rows(folder: Path) -> list[dict]:
    """Every part's rows, in PARTS order (the parts that exist)."""
    return [r for name in PARTS if (folder / name).is_file() for r in _read_rows(folder / name)]


def build_prompts(
    verifier,
    folder: Path,
    seed: int = SEED,
    sources: Callable[[object, int], tuple[list[list[dict]], list[dict]]] = broad_sources,
    name: str = "prompts.jsonl",
) -> Path:
    """STATE/``name``: the rows ``sources`` makes, deduplicated (against the parts before it
    too), evaluation-checked, and cut to MAX_PROMPT_TOKENS; written once (atomically), read as it
    is afterwards."""
    path = folder / name
    if path.is_file():
        return path
    singles, seconds = sources(verifier, seed)
    # build() dedupes on the last user turn, which second turns share: check them on their own.
    rows = build(singles, seed=seed) + seconds
    check_training_prompts([row_prompt(r) for r in seconds], "the second turns")
    earlier = {
        normalize_text(r["prompt"])
        for part in PARTS
        if part != name and (folder / part).is_file()
        for r in _read_rows(folder / part)
        if not r.get("messages")
    }
    rows = [r for r in rows if r.get("messages") or normalize_text(r["prompt"]) not in earlier]
    kept = []
    for r in rows:
        n = len(row_prompt(r).encode(verifier))
        if n <= MAX_PROMPT_TOKENS:
            kept.append({**r, "prompt_tokens": n})
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for r in kept:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    tmp.replace(path)
    log.info(
        "prompts: %d rows (%d over %d tokens dropped)",
        len(kept),
        len(rows) - len(kept),
        MAX_PROMPT_TOKENS,
    )
    return path


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    response_tokens: int


def generation_order(rows: Sequence[dict], seed: int = SEED) -> list[list[dict]]:
    """Chunks of rows in the order the campaign generates them: shuffled once (seeded), so that
    any finished prefix holds every kind, then each chunk of one length class (short or long),
    so a chunk's KV cache is sized for its own prompts."""
    order = list(rows)
    random.Random(seed).shuffle(order)
    chunks: list[list[dict]] = []
    for cls in ("short", "long"):
        same = [r for r in order if _length_class(r) == cls]
        chunks += [same[i : i + CHUNK] for i in range(0, len(same), CHUNK)]
    # Interleave the classes so a partial run has long prompts too.
    shorts = [c for c in chunks if _length_class(c[0]) == "short"]
    longs = [c for c in chunks if _length_class(c[0]) == "long"]
    mixed: list[list[dict]] = []
    while shorts or longs:
        for q in (shorts, longs):
            if q:
                mixed.append(q.pop(0))
    return mixed


def _length_class(row: dict) -> str:
    return "short" if row["prompt_tokens"] <= SHORT_TOKENS else "long"


def campaign_responses(
    verifier, folder: Path, max_new_tokens: int = MAX_NEW_TOKENS
) -> dict[str, tuple[int, ...]]:
    """Prompt key -> response, from the committed corpus and the campaign's own cache (it wins)."""
    return cached_responses(
        verifier_fingerprint(verifier),
        max_new_tokens,
        verifier.eos_token_ids,
        [shipped_data_dir() / "corpus", folder / "cache"],
    )


def status(verifier, folder: Path, max_new_tokens: int = MAX_NEW_TOKENS) -> Progress:
    """How many of the campaign's prompts have a response, and how many response tokens."""
    rows = campaign_rows(folder)
    cache = campaign_responses(verifier, folder, max_new_tokens)
    done = tokens = 0
    for r in rows:
        resp = cache.get(prompt_key(row_prompt(r).encode(verifier)))
        if resp is not None:
            done += 1
            tokens += len(resp)
    return Progress(done, len(rows), tokens)


def generate(
    verifier,
    folder: Path,
    dtype,
    on_chunk: Callable[[int, int, int, int, float], None] | None = None,
    max_new_tokens: int = MAX_NEW_TOKENS,
    shard: tuple[int, int] | None = None,
) -> None:
    """The verifier's greedy responses (up to MAX_NEW_TOKENS) to every campaign prompt, chunk by
    chunk, each appended to STATE/cache as it finishes; what is cached is skipped, so a killed
    run goes on where it stopped.  ``on_chunk(index, chunks, answered, response tokens,
    seconds)`` after each chunk, from what the chunk returned (no second pass over the cache).
    ``shard=(i, n)``: only the prompts whose key falls to process ``i`` of ``n`` (one process a
    core; the cache's appends are locked, so the shards share its file)."""
    rows = campaign_rows(folder)
    chunks = generation_order(rows)
    for i, chunk in enumerate(chunks):
        t0 = time.time()
        cls = _length_class(chunk[0])
        samples = self_distill(
            verifier,
            [row_prompt(r) for r in chunk],
            max_new_tokens,
            BATCH[cls],
            folder / "cache",
            max_prompt_tokens=MAX_PROMPT_TOKENS,
            generation_dtype=dtype,
            shard=shard,
        )
        if on_chunk is not None:
            tokens = sum(len(s.response_ids) for s in samples)
            on_chunk(i, len(chunks), len(samples), tokens, time.time() - t0)


def committed_dir() -> Path:
    """Where the campaign's prompts are committed (``data/corpus/campaign``); its responses sit
    beside the general corpus's (``data/corpus/responses-*-n256.jsonl.xz``), where every reader
    of the response caches looks."""
    return shipped_data_dir() / "corpus" / "campaign"


def commit_corpus(verifier, folder: Path, corpus: Path | None = None) -> list[Path]:
    """The campaign's prompt parts and its responses, xz-compressed, into ``corpus`` (default
    ``data/corpus``): committed once generation is done, so a bare machine starts again from them
    (``restore_part`` restores a part, ``cached_responses`` reads the responses).  Only the
    responses of the campaign's own prompts, in a fixed order (the same content, the same
    bytes).  Refused while a prompt lacks its response."""
    corpus = corpus or shipped_data_dir() / "corpus"
    cache = campaign_responses(verifier, folder)
    keys = sorted({prompt_key(row_prompt(r).encode(verifier)) for r in campaign_rows(folder)})
    missing = sum(k not in cache for k in keys)
    if missing:
        raise SpecUIError(
            f"{missing} campaign prompts have no response yet: commit the corpus once generation"
            " is done"
        )
    written = []
    for name in PARTS:
        written.append(_write_xz(corpus / "campaign" / f"{name}.xz", (folder / name).read_bytes()))
    lines = "".join(json.dumps({"key": k, "response_ids": list(cache[k])}) + "\n" for k in keys)
    name = cache_name(verifier, MAX_NEW_TOKENS) + ".xz"
    written.append(_write_xz(corpus / name, lines.encode("utf-8")))
    return written


def _write_xz(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    tmp.replace(path)
    return path


def cache_file(verifier, folder: Path) -> Path:
    return folder / "cache" / cache_name(verifier, MAX_NEW_TOKENS)


TRAIN_FILE = "train.jsonl"


@dataclass(frozen=True)
class Materialized:
    path: Path
    rows: int
    general: int  # of them the general corpus's training prompts (128-token responses)
    missing: int  # campaign prompts without a response yet (left out)


def materialize(verifier, folder: Path, seed: int = SEED, partial: bool = False) -> Materialized:
    """STATE/train.jsonl: the general corpus's training prompts with their shipped responses
    (capped at 128 tokens) and every campaign prompt with its response (256), one JSON row each
    (``prompt`` or ``messages``, and ``response_ids``), in one seeded shuffle so that any prefix
    (a short learning-rate check's ``--num-prompts``) holds every kind.  Training reads it as a
    prompt file: the rows bring their responses, so nothing is generated again, and the file's
    own held-out split (the ``campaign`` prompt set's, by content hash) is the campaign's
    evaluation split.  Refused while
    prompts still lack a response, unless ``partial`` (tests, a look at a running campaign)."""
    fingerprint = verifier_fingerprint(verifier)
    eos = verifier.eos_token_ids
    shipped = [shipped_data_dir() / "corpus"]
    general_cache = cached_responses(fingerprint, 128, eos, shipped)
    campaign_cache = campaign_responses(verifier, folder)
    out: list[dict] = []
    for p in load_prompts("general", split="train"):
        ids = p.encode(verifier)
        resp = general_cache.get(prompt_key(ids))
        if resp is not None:
            out.append(train_row(p, resp, p.meta.get("kind", "general"), len(ids)))
    general = len(out)
    missing = 0
    for r in campaign_rows(folder):
        p = row_prompt(r)
        ids = p.encode(verifier)
        resp = campaign_cache.get(prompt_key(ids))
        if resp is None:
            missing += 1
        else:
            out.append(train_row(p, resp, r["kind"], len(ids)))
    if missing and not partial:
        raise SpecUIError(
            f"{missing} campaign prompts have no response yet: generation is not done"
        )
    random.Random(seed).shuffle(out)
    path = folder / TRAIN_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out), "utf-8")
    tmp.replace(path)
    return Materialized(path, len(out), general, missing)


def mean_sequence_tokens(train_file: Path) -> float:
    """The mean prompt + response length of the materialized rows."""
    n = total = 0
    with train_file.open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            n += 1
            total += int(row.get("prompt_tokens", 0)) + len(row["response_ids"])
    return total / max(n, 1)


def train_row(p: Prompt, response: Sequence[int], kind: str, prompt_tokens: int) -> dict:
    """A train.jsonl row: the prompt as its text, turns or ids, its kind, size and response."""
    row: dict = {"id": p.id, "kind": kind, "prompt_tokens": prompt_tokens}
    if p.messages is not None:
        row["messages"] = list(p.messages)
    elif p.text is not None:
        row["prompt"] = p.text
    else:
        row["prompt_ids"] = list(p.token_ids or ())
    row["response_ids"] = list(response)
    return row
