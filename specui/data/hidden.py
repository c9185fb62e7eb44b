"""Verifier hidden states for training, in the speculators / vLLM sample layout.

One safetensors file per sample, as vLLM's ``extract_hidden_states`` connector
writes them (plus the loss mask):

* ``hidden_states`` ``[T, n_layers, H]`` bf16 -- the aux taps in the order of
  ``aux_layer_ids``, then ``tap[N]``, the last decoder layer *before* the final
  norm (the trainer turns it into target logits with the verifier's norm and
  LM head);
* ``token_ids`` ``[T]`` int64;
* ``loss_mask`` ``[T]`` int64 (1 on response tokens);
* ``target_ids`` ``[T, k]`` int64 and ``target_logprobs`` ``[T, k]`` float32: the
  verifier's top-k next tokens after each position and their log-probabilities,
  so a training step runs no part of the verifier (files vLLM writes lack them;
  they are added from ``tap[N]`` once, when such a file is first read).

Three ways to feed a trainer (``HiddenStateStore``):

* ``offline`` -- extract every sample first (``prepare``), then train from disk;
* ``online``  -- extract each batch when it is needed and delete the files after
  reading them: nothing accumulates on disk;
* ``mixed``   -- use files already on disk, extract the missing ones when first
  needed and keep them, so the cache fills during the first epoch.

Files are content-addressed (verifier, layers, token ids), so a cache is shared
by runs and a stale file is never used for another verifier.

Two stored forms (``StoreFormat``), read alike:

* ``bf16`` -- the layout above, ~4.8 KB a sequence token for the embedded verifier;
* ``int8`` -- for corpora that would not fit the disk in bf16 (the training campaign's 18 M
  sequence tokens: ~85 GB): the aux taps only (targets are stored, so ``tap[N]`` is not
  needed), each row of each tap int8 with a float32 scale (``hidden_scale`` ``[T, n_aux]``),
  the targets' ids int32 and log-probabilities float16: ~1.8 KB a token.  What this costs in
  accuracy is measured by ``bench/hidden_store.py``.

``HiddenStateExtractor`` is the interface; ``LocalExtractor`` runs the verifier
with ``transformers`` in this process, in bf16, many samples per forward.  A vLLM extractor
(batched, on a server)
implements the same ``extract`` and returns the files vLLM wrote.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from specui.data.distill import TokenSample, verifier_fingerprint
from specui.errors import SpecUIError

STORE_DTYPE = torch.bfloat16  # on disk; training computes in bf16 autocast, fp32 master weights
TOPK = 16  # targets kept per position (specui.algorithms.objective.Targets)
# (last_hidden [T, H] pre-norm) -> (ids [T, k], logprobs [T, k]): the verifier's final norm
# and LM head, for files written without targets.
TargetFn = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class StoreFormat(StrEnum):
    BF16 = "bf16"
    INT8 = "int8"


class ExtractionMode(StrEnum):
    OFFLINE = "offline"
    ONLINE = "online"
    MIXED = "mixed"


@dataclass
class SampleTensors:
    """One sample, ready for a trainer (fp32 features)."""

    input_ids: torch.Tensor  # [T] int64
    hidden_states: torch.Tensor  # [T, n_aux * H] cat of the aux taps (speculators' `hidden_states`)
    target_ids: torch.Tensor  # [T, k] int64 the verifier's top-k after each position
    target_logprobs: torch.Tensor  # [T, k] float32
    loss_mask: torch.Tensor  # [T] int64

    def __len__(self) -> int:
        return self.input_ids.shape[0]


class HiddenStateExtractor(ABC):
    """Runs the verifier over samples and writes one layout file per sample."""

    aux_layer_ids: list[int]
    num_layers: int  # the verifier's; tap[num_layers] is the pre-norm last layer
    fingerprint: str  # identifies the verifier (cache keys)
    store: StoreFormat = StoreFormat.BF16

    @property
    def layer_ids(self) -> list[int]:
        """The taps stored, in file order: aux layers then the last layer."""
        return [*self.aux_layer_ids, self.num_layers]

    def file_name(self, sample: TokenSample) -> str:
        h = hashlib.sha256(f"{self.fingerprint}|{self.layer_ids}|{sample.key}".encode())
        return h.hexdigest()[:24] + ".safetensors"

    @abstractmethod
    def extract(self, samples: Sequence[TokenSample], out_dir: Path) -> list[Path]:
        """Write ``out_dir / file_name(s)`` for each sample; return the paths in order."""


class LocalExtractor(HiddenStateExtractor):
    """Hidden states and targets from a ``specui.verifier.Verifier`` in this process.

    Batched: samples of similar length share a forward (right padding, at most
    ``batch_tokens`` padded tokens).  Where ``dtype`` is bf16 (the default on CPUs with
    AMX or AVX512-BF16: 4-5x float32's matmul rate) the verifier runs under bf16
    autocast: bf16 matmuls, the residual stream and norms in float32, which keeps the
    targets' argmax that of float32 on ~99% of positions where a bf16 copy of the
    model reaches ~98.9%.  The targets' top-k come from bf16 logits and are then scored
    again in float32 from the normed state, so near ties are ordered as float32 orders them.
    """

    def __init__(
        self,
        verifier,
        aux_layer_ids: Sequence[int],
        dtype: torch.dtype | None = None,
        batch_tokens: int = 4096,
        topk: int = TOPK,
        store: str | StoreFormat = StoreFormat.BF16,
    ) -> None:
        verifier.check_aux_layer_ids(list(aux_layer_ids))
        self.store = store_format(store)
        self.verifier = verifier
        self.aux_layer_ids = list(aux_layer_ids)
        self.num_layers = verifier.num_layers
        self.fingerprint = verifier_fingerprint(verifier)
        self.dtype = dtype or fast_matmul_dtype()
        self.batch_tokens = batch_tokens
        self.topk = min(topk, verifier.vocab_size)
        self._head: torch.Tensor | None = None

    def _autocast(self):
        device = next(self.verifier.model.parameters()).device
        return torch.autocast(
            device.type, dtype=self.dtype, enabled=self.dtype != self.verifier.dtype
        )

    def head(self) -> torch.Tensor:
        """The LM head in the extraction's dtype, cast once (it is 49k rows)."""
        if self._head is None:
            self._head = self.verifier.lm_head.weight.detach().to(self.dtype)
        return self._head

    def targets(
        self, last_hidden: torch.Tensor, start: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [T, k], logprobs [T, k]) of the verifier after each position from ``start``.

        Earlier positions get none (ids -1): no objective scores a slot whose target lies
        before the last prompt token, and the 49k-row LM head is a fifth of a forward.
        """
        T = last_hidden.shape[0]
        ids = torch.full((T, self.topk), -1, dtype=torch.long)
        lps = torch.full((T, self.topk), float("-inf"))
        if start < T:
            ids[start:], lps[start:] = topk_targets(
                self.verifier, last_hidden[start:], self.topk, self.head()
            )
        return ids, lps

    def extract(self, samples: Sequence[TokenSample], out_dir: Path) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        device = next(self.verifier.model.parameters()).device
        paths: dict[int, Path] = {}
        for batch in length_batches([len(s) for s in samples], self.batch_tokens):
            width = max(len(samples[i]) for i in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            for row, i in enumerate(batch):
                ids[row, : len(samples[i])] = torch.tensor(samples[i].input_ids, dtype=torch.long)
            lengths = [len(samples[i]) for i in batch]
            with self._autocast():
                taps = self.verifier.taps_batch(
                    ids.to(device), self.layer_ids
                )  # [N, W, n_aux + 1, H]
            for row, i in enumerate(batch):
                s, n = samples[i], lengths[row]
                t = taps[row, :n].float()
                target_ids, target_logprobs = self.targets(
                    t[:, -1], start=max(len(s.prompt_ids) - 1, 0)
                )
                path = out_dir / self.file_name(s)
                write_sample(
                    path,
                    t,
                    ids[row, :n],
                    torch.tensor(s.loss_mask, dtype=torch.long),
                    {"verifier": self.fingerprint, "layer_ids": str(self.layer_ids)},
                    target_ids=target_ids,
                    target_logprobs=target_logprobs,
                    store=self.store,
                )
                paths[i] = path
        return [paths[i] for i in range(len(samples))]


def store_format(value: str | StoreFormat) -> StoreFormat:
    try:
        return StoreFormat(value)
    except ValueError:
        raise SpecUIError(
            f"unknown hidden-state store {value!r}; use {' or '.join(f.value for f in StoreFormat)}"
        ) from None


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 rows with a float32 scale each (symmetric, the largest magnitude at 127).  A tap's
    row has a few large channels (the residual stream's outliers); a scale per row keeps the
    others' error at about 0.4% of that row's largest value."""
    x = x.float()
    scale = x.abs().amax(-1).clamp_min(1e-12) / 127.0
    q = torch.round(x / scale.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float().unsqueeze(-1)


def fast_matmul_dtype() -> torch.dtype:
    """bf16 where this CPU (or any CUDA GPU) has fast bf16 matmuls, else float32: the
    dtype extraction, generation and training steps multiply in by default."""
    if torch.cuda.is_available():
        return torch.bfloat16
    return (
        torch.bfloat16
        if torch.backends.cpu.get_cpu_capability() in ("AVX512", "AMX")
        else torch.float32
    )


def length_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped by similar length, each group at most ``batch_tokens`` padded tokens
    (a longer sample goes alone): little compute is spent on padding."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and lengths[i] * (len(batches[-1]) + 1) <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


@torch.inference_mode()
def topk_targets(
    verifier,
    last_hidden: torch.Tensor,
    k: int = TOPK,
    head: torch.Tensor | None = None,
    spare: int = 8,
    chunk: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The verifier's top-k log-probs after each position, from its pre-norm last layer.

    The LM head runs with ``head`` (its weight in bf16, say: the costly 49k-row matmul);
    the best ``k + spare`` candidates are then scored again in float32, which fixes their
    order and values, and the log-normaliser comes from the fast logits (its error is far
    below the resolution of a single bf16 logit).
    """
    head32 = verifier.lm_head.weight.float()
    head = head32 if head is None else head
    bias = getattr(verifier.lm_head, "bias", None)
    ids_out, lp_out = [], []
    for start in range(0, last_hidden.shape[0], chunk):
        h32 = verifier.final_norm(last_hidden[start : start + chunk].to(head32.dtype)).float()
        logits = torch.nn.functional.linear(h32.to(head.dtype), head).float()
        if bias is not None:
            logits = logits + bias.float()
        lse = torch.logsumexp(logits, -1, keepdim=True)
        cand = logits.topk(min(k + spare, logits.shape[-1]), dim=-1).indices  # [t, c]
        exact = torch.einsum("th,tch->tc", h32, head32[cand])
        if bias is not None:
            exact = exact + bias.float()[cand]
        values, order = exact.topk(min(k, cand.shape[1]), dim=-1)
        ids_out.append(cand.gather(-1, order))
        lp_out.append(values - lse)
    return torch.cat(ids_out).cpu(), torch.cat(lp_out).cpu()


def write_sample(
    path: Path,
    hidden_states: torch.Tensor,
    token_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    metadata: dict[str, str] | None = None,
    *,
    target_ids: torch.Tensor | None = None,
    target_logprobs: torch.Tensor | None = None,
    store: str | StoreFormat = StoreFormat.BF16,
) -> None:
    """Write one sample file atomically (a reader never sees half a file).

    ``hidden_states`` is ``[T, n_aux + 1, H]`` (the aux taps, then tap[N]).  The ``int8`` store
    needs the targets (it keeps the aux taps only) and writes the compact form."""
    store = store_format(store)
    has_targets = target_ids is not None and target_logprobs is not None
    if store == StoreFormat.INT8:
        if not has_targets:
            raise SpecUIError("the int8 hidden-state store keeps no tap[N]: it needs the targets")
        q, scale = quantize_rows(hidden_states[:, :-1].to("cpu"))
        tensors = {
            "hidden_states": q.contiguous(),  # [T, n_aux, H] int8
            "hidden_scale": scale.contiguous(),  # [T, n_aux] float32
            "token_ids": token_ids.to("cpu", torch.int32).contiguous(),
            "loss_mask": loss_mask.to("cpu", torch.uint8).contiguous(),
            "target_ids": target_ids.to("cpu", torch.int32).contiguous(),
            "target_logprobs": target_logprobs.to("cpu", torch.float16).contiguous(),
        }
    else:
        tensors = {
            "hidden_states": hidden_states.to("cpu", STORE_DTYPE).contiguous(),
            "token_ids": token_ids.to("cpu", torch.long).contiguous(),
            "loss_mask": loss_mask.to("cpu", torch.long).contiguous(),
        }
        if has_targets:
            tensors["target_ids"] = target_ids.to("cpu", torch.long).contiguous()
            tensors["target_logprobs"] = target_logprobs.to("cpu", torch.float32).contiguous()
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_sample(path: Path, n_aux: int, targets: TargetFn | None = None) -> SampleTensors:
    """Load a layout file (memory-mapped): the aux taps as features, and the targets.

    A file without targets (vLLM's) gets them from its ``tap[N]`` through ``targets``,
    and is rewritten with them, so the verifier's head runs once per sample, not per step.
    """
    try:
        with safe_open(str(path), "pt") as f:
            names = set(f.keys())
            metadata = f.metadata()
            hs = f.get_slice("hidden_states")
            shape = hs.get_shape()
            compact = "hidden_scale" in names  # the int8 store: aux taps only
            want = n_aux if compact else n_aux + 1
            if len(shape) != 3 or shape[1] != want:
                raise SpecUIError(
                    f"hidden-state file {path} holds {tuple(shape)}; expected [T, {want}, H]"
                )
            stored = "target_ids" in names and "target_logprobs" in names
            if compact:
                if not stored:
                    raise SpecUIError(f"hidden-state file {path}: int8 taps without targets")
                taps = dequantize_rows(f.get_tensor("hidden_states"), f.get_tensor("hidden_scale"))
            else:
                taps = hs[:, :n_aux] if stored else f.get_tensor("hidden_states")
            t = {
                k: f.get_tensor(k)
                for k in ("token_ids", "loss_mask", "target_ids", "target_logprobs")
                if k in names
            }
    except (OSError, SafetensorError) as e:
        raise SpecUIError(f"cannot read hidden-state file {path}: {e}") from None
    T = shape[0]
    mask = t.get("loss_mask")
    if mask is None:  # a vLLM-written file has no mask: train on every position
        mask = torch.ones(T, dtype=torch.long)
    if not stored:
        if targets is None:
            raise SpecUIError(
                f"hidden-state file {path} has no targets and no verifier head was given to add"
                " them"
            )
        ids, lps = targets(taps[:, n_aux].float())
        write_sample(
            path, taps, t["token_ids"], mask, metadata, target_ids=ids, target_logprobs=lps
        )
        t["target_ids"], t["target_logprobs"] = ids, lps
        taps = taps[:, :n_aux]
    return SampleTensors(
        input_ids=t["token_ids"].long(),
        hidden_states=taps.reshape(T, -1).float(),
        target_ids=t["target_ids"].long(),
        target_logprobs=t["target_logprobs"].float(),
        loss_mask=mask.long(),
    )


def bytes_per_token(
    n_taps: int, hidden_size: int, topk: int = TOPK, store: str | StoreFormat = StoreFormat.BF16
) -> int:
    """Disk one sequence token takes in a layout file (taps, targets, ids and mask);
    ``n_taps`` counts tap[N], which the int8 store leaves out."""
    if store_format(store) == StoreFormat.INT8:
        return (n_taps - 1) * (hidden_size + 4) + topk * (4 + 2) + 5
    return n_taps * hidden_size * STORE_DTYPE.itemsize + topk * (8 + 4) + 16


class HiddenStateStore:
    """Hands a trainer the hidden states of sample ``i`` in the chosen mode.

    ``targets`` adds the verifier's targets to files written without them (see
    ``read_sample``); a ``LocalExtractor`` brings its own.
    """

    def __init__(
        self,
        extractor: HiddenStateExtractor,
        samples: Sequence[TokenSample],
        mode: str | ExtractionMode,
        cache_dir: str | Path,
        targets: TargetFn | None = None,
    ) -> None:
        try:
            self.mode = ExtractionMode(mode)
        except ValueError:
            raise SpecUIError(
                f"unknown extraction mode {mode!r}; use offline, online or mixed"
            ) from None
        self.extractor = extractor
        self.samples = list(samples)
        self.cache_dir = Path(cache_dir)
        self.n_aux = len(extractor.aux_layer_ids)
        self.target_fn = targets or getattr(extractor, "targets", None)

    def path(self, i: int) -> Path:
        return self.cache_dir / self.extractor.file_name(self.samples[i])

    def missing(self, indices: Sequence[int] | None = None) -> list[int]:
        indices = range(len(self.samples)) if indices is None else indices
        return [i for i in indices if not self.path(i).is_file()]

    def bytes_needed(self, indices: Sequence[int], hidden_size: int) -> int:
        """Disk the missing samples of ``indices`` will take once extracted."""
        per = bytes_per_token(
            len(self.extractor.layer_ids), hidden_size, store=self.extractor.store
        )
        return per * sum(len(self.samples[i]) for i in self.missing(indices))

    def check_disk(self, indices: Sequence[int], hidden_size: int) -> int:
        """Refuse, before extracting anything, when the cache's disk cannot hold the files."""
        need = self.bytes_needed(indices, hidden_size)
        where = self.cache_dir
        while not where.exists() and where != where.parent:
            where = where.parent
        free = shutil.disk_usage(where).free
        if need > 0.95 * free:
            raise SpecUIError(
                f"extracting hidden states needs {need / 2**30:.1f} GiB in {self.cache_dir}, but"
                f" only {free / 2**30:.1f} GiB are free; free some space, or pass --cache-dir on a"
                " larger disk"
            )
        return need

    def prepare(
        self,
        indices: Sequence[int] | None = None,
        progress: Callable[[int, int], None] | None = None,
        chunk: int = 64,
    ) -> None:
        """Offline mode: extract every missing sample of ``indices`` (default: all) now.

        ``chunk`` samples per call of the extractor (a local one batches them by length);
        each call's files are complete on disk before the next, so a killed run resumes
        where it stopped.
        """
        if self.mode != ExtractionMode.OFFLINE:
            return
        todo = self.missing(indices)
        if progress:
            progress(0, len(todo))
        for start in range(0, len(todo), chunk):
            part = todo[start : start + chunk]
            self.extractor.extract([self.samples[i] for i in part], self.cache_dir)
            if progress:
                progress(min(start + chunk, len(todo)), len(todo))

    def get(self, indices: Sequence[int]) -> list[SampleTensors]:
        """The samples ``indices``, extracting what the mode says must be extracted now."""
        if self.mode == ExtractionMode.ONLINE:
            with tempfile.TemporaryDirectory(prefix="specui-hidden-") as scratch:
                paths = self.extractor.extract([self.samples[i] for i in indices], Path(scratch))
                out = [read_sample(p, self.n_aux, self.target_fn) for p in paths]
                for p in paths:
                    p.unlink(missing_ok=True)  # delete after use, as soon as read
                return out
        missing = self.missing(indices)
        if missing:
            if self.mode == ExtractionMode.OFFLINE:
                raise SpecUIError(
                    f"{len(missing)} hidden-state files missing from {self.cache_dir}; run the"
                    " offline extraction first"
                )
            self.extractor.extract([self.samples[i] for i in missing], self.cache_dir)
        return [read_sample(self.path(i), self.n_aux, self.target_fn) for i in indices]
