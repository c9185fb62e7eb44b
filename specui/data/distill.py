"""Self-distillation: the verifier writes the responses a drafter is trained on.

A drafter is scored on how often the *verifier* agrees with it, so the best
training text is the verifier's own greedy output.  Responses are generated in
batches (left padding, ``transformers`` ``generate``) and cached on disk as
JSONL of token ids, keyed by verifier and prompt, appended batch by batch so an
interrupted run keeps what it finished.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specui.data.prompts import Prompt
from specui.errors import SpecUIError
from specui.paths import shipped_data_dir

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (done, total)


@dataclass(frozen=True)
class TokenSample:
    """One training sequence: prompt ids then response ids (the loss covers the response)."""

    id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]

    @property
    def input_ids(self) -> list[int]:
        return [*self.prompt_ids, *self.response_ids]

    @property
    def loss_mask(self) -> list[int]:
        return [0] * len(self.prompt_ids) + [1] * len(self.response_ids)

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def key(self) -> str:
        """Content hash of the token ids (and where the loss starts)."""
        return _hash_ids(self.prompt_ids, self.response_ids)


def _hash_ids(*seqs: Sequence[int]) -> str:
    h = hashlib.sha256()
    for s in seqs:
        h.update(b"|" + ",".join(map(str, s)).encode())
    return h.hexdigest()


def prompt_key(prompt_ids: Sequence[int]) -> str:
    """The response cache's key of a prompt: the hash of its token ids."""
    return _hash_ids(prompt_ids)


# Config fields that say where and how a model was loaded, not what it computes: a cache must
# survive another folder (another machine's cache path) and a transformers upgrade.
_PROVENANCE_KEYS = ("_name_or_path", "transformers_version", "torch_dtype", "dtype")


def verifier_fingerprint(verifier) -> str:
    """A short id of the verifier's weights and architecture: caches of another model never match."""
    cfg = {k: v for k, v in verifier.config.to_dict().items() if k not in _PROVENANCE_KEYS}
    h = hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode())
    h.update(verifier.fingerprint.encode())
    return h.hexdigest()[:16]


def self_distill(
    verifier,
    prompts: Sequence[Prompt],
    max_new_tokens: int = 256,
    batch_size: int = 8,
    cache_dir: str | Path | None = None,
    max_prompt_tokens: int | None = None,
    progress: Progress | None = None,
    generation_dtype: torch.dtype | None = None,
    engine: str = "fast",
    shard: tuple[int, int] | None = None,
) -> list[TokenSample]:
    """Greedy verifier responses for ``prompts`` (cached); one TokenSample per prompt.

    Prompts that bring their own ``response_ids`` are used as they are.
    ``max_prompt_tokens`` keeps the *last* tokens of longer prompts (the end of
    a chat is what the response continues).  ``generation_dtype`` generates in that dtype
    (bf16: several times the throughput on CPUs with bf16 matmuls) while the cache stays
    keyed by the verifier as loaded, so training finds it.  ``engine``: ``fast``
    (``specui.data.generate``: continuous batching over a preallocated cache, each response
    appended to the cache as it finishes) or ``transformers`` (``generate_greedy`` batch by
    batch, the old path).  ``shard=(i, n)`` generates only the missing prompts whose key falls
    to worker ``i`` of ``n`` and returns only the samples known so far (``distill_in_processes``).
    """
    if max_new_tokens < 1:
        raise SpecUIError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if batch_size < 1:
        raise SpecUIError(f"batch size must be >= 1, got {batch_size}")
    # Here, not at the top: the fast path's modules import transformers, which a caller that
    # only reads the cache (export_cache) should not wait for.
    from specui.data.generate import ENGINES, generate_responses

    if engine not in ENGINES:
        raise SpecUIError(f"generation engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    encoded: list[tuple[Prompt, tuple[int, ...]]] = []
    for p in prompts:
        ids = p.encode(verifier)
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            ids = ids[-max_prompt_tokens:]
        bad = [t for t in ids if not 0 <= t < verifier.vocab_size]
        if bad:
            raise SpecUIError(f"prompt {p.id}: token ids {bad[:5]} outside the verifier's vocabulary ({verifier.vocab_size})")
        encoded.append((p, tuple(ids)))

    name = cache_name(verifier, max_new_tokens)
    # The responses the repository ships (data/corpus/, for the embedded verifier) first: hours
    # of generation nobody has to repeat; the run's own cache adds to them.
    cache: dict[str, tuple[int, ...]] = _read_cache(shipped_data_dir() / "corpus" / f"{name}.gz")
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / name
        cache.update(_read_cache(path))

    todo = [(p, ids) for p, ids in encoded if p.response_ids is None and _hash_ids(ids) not in cache]
    if shard is not None:
        index, count = shard
        todo = [(p, ids) for p, ids in todo if int(_hash_ids(ids), 16) % count == index]
    # Similar lengths in one batch waste less compute on padding (and, continuously batched,
    # on attention over the longest row).
    todo.sort(key=lambda pi: len(pi[1]))
    if engine == "fast":
        batch = [ids for _, ids in todo]

        def keep(index: int, response: tuple[int, ...]) -> None:
            new = {_hash_ids(batch[index]): response}
            cache.update(new)
            if path is not None:
                _append_cache(path, new)

        if progress:
            progress(0, len(todo))
        if todo:
            generate_responses(verifier, batch, max_new_tokens, batch_size, progress=progress,
                               on_done=keep, dtype=generation_dtype)
    else:
        _generate_in_batches(
            verifier, [ids for _, ids in todo], max_new_tokens, batch_size, cache, path, progress,
            generation_dtype,
        )

    out = []
    for p, ids in encoded:
        resp = p.response_ids if p.response_ids is not None else cache.get(_hash_ids(ids))
        if resp is not None:  # missing only for another shard's prompts
            out.append(TokenSample(p.id, ids, tuple(resp)))
    return out


def cache_name(verifier, max_new_tokens: int) -> str:
    """The response cache's file name for this verifier and response length."""
    return f"responses-{verifier_fingerprint(verifier)}-n{max_new_tokens}.jsonl"


def _generate_in_batches(
    verifier,
    todo: list[tuple[int, ...]],
    max_new_tokens: int,
    batch_size: int,
    cache: dict,
    path: Path | None,
    progress: Progress | None,
    generation_dtype: torch.dtype | None,
) -> None:
    total, done = len(todo), 0
    if progress:
        progress(0, total)
    generator = verifier
    if todo and generation_dtype is not None and generation_dtype != verifier.dtype:
        import copy

        generator = copy.copy(verifier)
        generator.model = copy.deepcopy(verifier.model).to(generation_dtype)
    for start in range(0, total, batch_size):
        batch = todo[start : start + batch_size]
        responses = generate_greedy(generator, batch, max_new_tokens)
        new = {_hash_ids(ids): resp for ids, resp in zip(batch, responses, strict=True)}
        cache.update(new)
        if path is not None:
            _append_cache(path, new)
        done += len(batch)
        if progress:
            progress(done, total)


def _shard_worker(spec: str, shard: tuple[int, int], prompts: Sequence[Prompt], kwargs: dict,
                  threads: int, queue) -> None:
    torch.set_num_threads(threads)
    from specui.verifier import Verifier

    verifier = Verifier.load(spec)

    def progress(done: int, total: int) -> None:
        queue.put((shard[0], done, total))

    self_distill(verifier, prompts, shard=shard, progress=progress, **kwargs)


def distill_in_processes(
    spec: str,
    prompts: Sequence[Prompt],
    procs: int,
    max_new_tokens: int,
    cache_dir: str | Path,
    batch_size: int = 64,
    max_prompt_tokens: int | None = None,
    generation_dtype: torch.dtype | None = None,
    progress: Progress | None = None,
    threads: int = 1,
) -> None:
    """Fill ``cache_dir``'s response cache for ``prompts`` with ``procs`` worker processes.

    Each worker loads the verifier ``spec`` (``Verifier.load``) with ``threads`` torch
    threads and generates the missing prompts whose key hash falls to it, appending each
    response to the one shared cache file as it finishes (appends are locked).  A killed run
    keeps what finished; run it again to continue.  ``progress(done, total)`` sums the workers'.
    """
    import multiprocessing as mp

    if procs < 1:
        raise SpecUIError(f"processes must be >= 1, got {procs}")
    # spawn: a fork of a parent's torch thread pools and loaded model is neither safe nor cheaper.
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    kwargs = dict(max_new_tokens=max_new_tokens, batch_size=batch_size, cache_dir=str(cache_dir),
                  max_prompt_tokens=max_prompt_tokens, generation_dtype=generation_dtype)
    workers = [
        ctx.Process(
            target=_shard_worker, args=(spec, (i, procs), list(prompts), kwargs, threads, queue)
        )
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    counts: dict[int, tuple[int, int]] = {}
    try:
        while any(w.is_alive() for w in workers) or not queue.empty():
            try:
                worker, done, total = queue.get(timeout=0.5)
            except Exception:  # queue.Empty: nothing reported this half second
                continue
            counts[worker] = (done, total)
            if progress and len(counts) == procs:
                progress(sum(d for d, _ in counts.values()), sum(t for _, t in counts.values()))
    finally:
        for w in workers:
            w.join()
    failed = [i for i, w in enumerate(workers) if w.exitcode != 0]
    if failed:
        raise SpecUIError(f"response generation: worker(s) {failed} failed (exit codes "
                          f"{[workers[i].exitcode for i in failed]}); run again to continue")


@torch.inference_mode()
def generate_greedy(verifier, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[tuple[int, ...]]:
    """Greedy continuations of a batch of token-id prompts, cut after the first EOS."""
    eos = sorted(verifier.eos_token_ids)
    tok = verifier.tokenizer
    pad = getattr(tok, "pad_token_id", None) if tok is not None else None
    pad = pad if pad is not None else (eos[0] if eos else 0)
    width = max(len(p) for p in prompts)
    # Left padding: every prompt ends at the same column, so generated tokens line up.
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    device = next(verifier.model.parameters()).device
    out = verifier.model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        pad_token_id=pad,
        eos_token_id=eos or None,
        # These would otherwise come from generation_config and make "greedy" not greedy.
        temperature=None,
        top_p=None,
        top_k=None,
    )
    responses = []
    for row in out[:, width:].cpu().tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        responses.append(tuple(row[:cut]))
    return responses


def _read_cache(path: Path) -> dict[str, tuple[int, ...]]:
    cache: dict[str, tuple[int, ...]] = {}
    if not path.is_file():
        return cache
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for lineno, line in enumerate(text.splitlines(), start=1):
        try:
            row = json.loads(line)
            cache[row["key"]] = tuple(int(t) for t in row["response_ids"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            # A crash mid-append leaves one torn line; the prompt is generated again.
            log.warning("%s:%d: unreadable cached response (skipped)", path, lineno)
    return cache


def _append_cache(path: Path, new: dict[str, tuple[int, ...]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({"key": k, "response_ids": list(r)}) + "\n" for k, r in new.items())
    with path.open("a") as f:
        # Worker processes (distill_in_processes) append to one file: whole lines, one at a time.
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def synthetic_prompts(n: int, vocab_size: int, min_len: int = 8, max_len: int = 24, seed: int = 0,
                      exclude: Sequence[int] = ()) -> list[Prompt]:
    """Random token-id prompts for verifiers without a tokenizer (tests, smoke runs)."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([t for t in range(vocab_size) if t not in set(exclude)])
    out = []
    for i in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        ids = allowed[torch.randint(len(allowed), (length,), generator=g)].tolist()
        out.append(Prompt(f"synthetic-{seed}-{i}", "synthetic", token_ids=tuple(ids)))
    return out


def export_cache(cache_dir: str | Path, dest_dir: str | Path, keep: set[str] | None = None) -> list[Path]:
    """Gzip the response caches of ``cache_dir`` into ``dest_dir`` (what ``self_distill`` reads
    first), only the keys in ``keep`` when given, in a stable order (same content, same bytes)."""
    out = []
    for src in sorted(Path(cache_dir).glob("responses-*.jsonl")):
        rows = _read_cache(src)
        lines = "".join(json.dumps({"key": k, "response_ids": list(v)}) + "\n" for k, v in sorted(rows.items())
                        if keep is None or k in keep)  # fmt: skip
        dest = Path(dest_dir) / f"{src.name}.gz"
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".tmp")
        tmp.write_bytes(gzip.compress(lines.encode(), mtime=0))
        tmp.replace(dest)
        out.append(dest)
    return out
