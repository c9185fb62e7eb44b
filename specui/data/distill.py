"""Self-distillation: the verifier writes the responses a drafter is trained on.

A drafter is scored on how often the *verifier* agrees with it, so the best
training text is the verifier's own greedy output.  Responses are generated in
batches (left padding, ``transformers`` ``generate``) and cached on disk as
JSONL of token ids, keyed by verifier and prompt, appended batch by batch so an
interrupted run keeps what it finished.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specui.data.prompts import Prompt
from specui.paths import shipped_data_dir
from specui.trace import SpecUIError

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
) -> list[TokenSample]:
    """Greedy verifier responses for ``prompts`` (cached); one TokenSample per prompt.

    Prompts that bring their own ``response_ids`` are used as they are.
    ``max_prompt_tokens`` keeps the *last* tokens of longer prompts (the end of
    a chat is what the response continues).  ``generation_dtype`` generates with a
    copy of the model in that dtype (bf16: 2-3x the batched throughput on CPUs with
    AMX) while the cache stays keyed by the verifier as loaded, so training finds it.
    """
    if max_new_tokens < 1:
        raise SpecUIError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if batch_size < 1:
        raise SpecUIError(f"batch size must be >= 1, got {batch_size}")
    encoded: list[tuple[Prompt, tuple[int, ...]]] = []
    for p in prompts:
        ids = p.encode(verifier)
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            ids = ids[-max_prompt_tokens:]
        bad = [t for t in ids if not 0 <= t < verifier.vocab_size]
        if bad:
            raise SpecUIError(f"prompt {p.id}: token ids {bad[:5]} outside the verifier's vocabulary ({verifier.vocab_size})")
        encoded.append((p, tuple(ids)))

    fingerprint = verifier_fingerprint(verifier)
    name = f"responses-{fingerprint}-n{max_new_tokens}.jsonl"
    # The responses the repository ships (data/corpus/, for the embedded verifier) first: hours
    # of generation nobody has to repeat; the run's own cache adds to them.  Caches of any cap
    # serve: a longer one by cutting, a shorter one where the response ended before its cap.
    folders = [shipped_data_dir() / "corpus"]
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / name
        folders.append(Path(cache_dir))
    cache = cached_responses(fingerprint, max_new_tokens, verifier.eos_token_ids, folders)

    todo = [(p, ids) for p, ids in encoded if p.response_ids is None and _hash_ids(ids) not in cache]
    # Similar lengths in one batch waste less compute on padding.
    todo.sort(key=lambda pi: len(pi[1]))
    total, done = len(todo), 0
    if progress:
        progress(0, total)
    generator = verifier
    if todo and generation_dtype is not None and generation_dtype != verifier.dtype:
        import copy

        generator = copy.copy(verifier)
        generator.model = copy.deepcopy(verifier.model).to(generation_dtype)
    for start in range(0, total, batch_size):
        batch = [ids for _, ids in todo[start : start + batch_size]]
        responses = generate_greedy(generator, batch, max_new_tokens)
        new = {_hash_ids(ids): resp for ids, resp in zip(batch, responses, strict=True)}
        cache.update(new)
        if path is not None:
            _append_cache(path, new)
        done += len(batch)
        if progress:
            progress(done, total)

    out = []
    for p, ids in encoded:
        resp = p.response_ids if p.response_ids is not None else cache[_hash_ids(ids)]
        out.append(TokenSample(p.id, ids, tuple(resp)))
    return out


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


_CACHE_FILE = re.compile(r"responses-(?P<fingerprint>[0-9a-f]+)-n(?P<cap>[0-9]+)\.jsonl(?:\.gz)?")


def cached_responses(
    fingerprint: str, max_new_tokens: int, eos: Collection[int], folders: Sequence[Path]
) -> dict[str, tuple[int, ...]]:
    """prompt key -> the response greedy generation with a cap of ``max_new_tokens`` gives,
    for every prompt some response cache of this verifier in ``folders`` answers.

    A cache file is ``responses-{fingerprint}-n{cap}.jsonl[.gz]``.  Greedy decoding is
    prefix-consistent, so a response of a longer cap, cut to ``max_new_tokens``, is the
    shorter request's response; one that stopped before its cap (at an EOS) is the response
    of every longer cap too.  Where several files answer a prompt, a file of exactly this cap
    wins, then a later folder (the run's own cache over the shipped one).
    """
    found: list[tuple[bool, int, int, Path]] = []
    for rank, folder in enumerate(folders):
        if not folder.is_dir():
            continue
        for f in folder.glob(f"responses-{fingerprint}-n*"):
            m = _CACHE_FILE.fullmatch(f.name)
            if m and m["fingerprint"] == fingerprint and f.is_file():
                found.append((int(m["cap"]) == max_new_tokens, rank, int(m["cap"]), f))
    stops = frozenset(eos)
    cache: dict[str, tuple[int, ...]] = {}
    for _, _, cap, f in sorted(found):  # least preferred first: the later ones overwrite
        for key, resp in _read_cache(f).items():
            served = serve_response(resp, cap, max_new_tokens, stops)
            if served is not None:
                cache[key] = served
    return cache


def serve_response(
    response: Sequence[int], cap: int, max_new_tokens: int, eos: Collection[int]
) -> tuple[int, ...] | None:
    """What a response cached with a cap of ``cap`` new tokens says for a request of
    ``max_new_tokens`` (None: nothing, its generation had not ended at its cap)."""
    head = tuple(response[:max_new_tokens])
    # Generation cuts after the first EOS; cut here too (a file written otherwise), since
    # generation with this cap would stop there as well.
    stop = next((i + 1 for i, t in enumerate(head) if t in eos), None)
    if stop is not None:
        return head[:stop]  # it ended within this request's cap: complete for any cap
    if max_new_tokens <= cap or len(response) < cap:
        # Cut to a shorter cap, or it stopped before its own without an EOS (the context's end):
        # greedy decoding is prefix-consistent, so this is what the request would generate.
        return head
    return None


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
    with path.open("a") as f:
        for key, resp in new.items():
            f.write(json.dumps({"key": key, "response_ids": list(resp)}) + "\n")
        f.flush()
        os.fsync(f.fileno())


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
