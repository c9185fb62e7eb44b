"""Verifier hidden states for training, in the speculators / vLLM sample layout.

One safetensors file per sample, as vLLM's ``extract_hidden_states`` connector
writes them (plus the loss mask):

* ``hidden_states`` ``[T, n_layers, H]`` bf16 -- the aux taps in the order of
  ``aux_layer_ids``, then ``tap[N]``, the last decoder layer *before* the final
  norm (the trainer turns it into target logits with the verifier's norm and
  LM head);
* ``token_ids`` ``[T]`` int64;
* ``loss_mask`` ``[T]`` int64 (1 on response tokens).

Three ways to feed a trainer (``HiddenStateStore``):

* ``offline`` -- extract every sample first (``prepare``), then train from disk;
* ``online``  -- extract each batch when it is needed and delete the files after
  reading them: nothing accumulates on disk;
* ``mixed``   -- use files already on disk, extract the missing ones when first
  needed and keep them, so the cache fills during the first epoch.

Files are content-addressed (verifier, layers, token ids), so a cache is shared
by runs and a stale file is never used for another verifier.

``HiddenStateExtractor`` is the interface; ``LocalExtractor`` runs the verifier
with ``transformers`` in this process.  A vLLM extractor (batched, on a server)
implements the same ``extract`` and returns the files vLLM wrote.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from specui.data.distill import TokenSample, verifier_fingerprint
from specui.trace import SpecUIError

STORE_DTYPE = torch.bfloat16  # on disk; training computes in fp32


class ExtractionMode(StrEnum):
    OFFLINE = "offline"
    ONLINE = "online"
    MIXED = "mixed"


@dataclass
class SampleTensors:
    """One sample, ready for a trainer (fp32 features)."""

    input_ids: torch.Tensor  # [T] int64
    hidden_states: torch.Tensor  # [T, n_aux * H] cat of the aux taps (speculators' `hidden_states`)
    last_hidden: torch.Tensor  # [T, H] tap[N], pre-final-norm (`verifier_last_hidden_states`)
    loss_mask: torch.Tensor  # [T] int64

    def __len__(self) -> int:
        return self.input_ids.shape[0]


class HiddenStateExtractor(ABC):
    """Runs the verifier over samples and writes one layout file per sample."""

    aux_layer_ids: list[int]
    num_layers: int  # the verifier's; tap[num_layers] is the pre-norm last layer
    fingerprint: str  # identifies the verifier (cache keys)

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
    """Hidden states from a ``specui.verifier.Verifier`` in this process."""

    def __init__(self, verifier, aux_layer_ids: Sequence[int]) -> None:
        verifier.check_aux_layer_ids(list(aux_layer_ids))
        self.verifier = verifier
        self.aux_layer_ids = list(aux_layer_ids)
        self.num_layers = verifier.num_layers
        self.fingerprint = verifier_fingerprint(verifier)

    def extract(self, samples: Sequence[TokenSample], out_dir: Path) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = []
        device = next(self.verifier.model.parameters()).device
        for s in samples:
            ids = torch.tensor(s.input_ids, dtype=torch.long)
            taps = self.verifier.taps(ids.to(device), self.layer_ids)  # [T, n_aux + 1, H]
            path = out_dir / self.file_name(s)
            write_sample(path, taps, ids, torch.tensor(s.loss_mask, dtype=torch.long),
                         {"verifier": self.fingerprint, "layer_ids": str(self.layer_ids)})
            paths.append(path)
        return paths


def write_sample(path: Path, hidden_states: torch.Tensor, token_ids: torch.Tensor, loss_mask: torch.Tensor,
                 metadata: dict[str, str] | None = None) -> None:
    """Write one sample file atomically (a reader never sees half a file)."""
    tensors = {
        "hidden_states": hidden_states.to("cpu", STORE_DTYPE).contiguous(),
        "token_ids": token_ids.to("cpu", torch.long).contiguous(),
        "loss_mask": loss_mask.to("cpu", torch.long).contiguous(),
    }
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_sample(path: Path, n_aux: int) -> SampleTensors:
    """Load a layout file: split the stored taps into aux features and the last layer."""
    try:
        t = load_file(str(path))
    except (OSError, SafetensorError) as e:
        raise SpecUIError(f"cannot read hidden-state file {path}: {e}") from None
    hs = t["hidden_states"].float()  # [T, n_aux + 1, H]
    if hs.dim() != 3 or hs.shape[1] != n_aux + 1:
        raise SpecUIError(f"hidden-state file {path} holds {tuple(hs.shape)}; expected [T, {n_aux + 1}, H]")
    T = hs.shape[0]
    mask = t.get("loss_mask")
    if mask is None:  # a vLLM-written file has no mask: train on every position
        mask = torch.ones(T, dtype=torch.long)
    return SampleTensors(
        input_ids=t["token_ids"].long(),
        hidden_states=hs[:, :n_aux].reshape(T, -1),
        last_hidden=hs[:, n_aux],
        loss_mask=mask.long(),
    )


class HiddenStateStore:
    """Hands a trainer the hidden states of sample ``i`` in the chosen mode."""

    def __init__(self, extractor: HiddenStateExtractor, samples: Sequence[TokenSample], mode: str | ExtractionMode,
                 cache_dir: str | Path) -> None:
        try:
            self.mode = ExtractionMode(mode)
        except ValueError:
            raise SpecUIError(f"unknown extraction mode {mode!r}; use offline, online or mixed") from None
        self.extractor = extractor
        self.samples = list(samples)
        self.cache_dir = Path(cache_dir)
        self.n_aux = len(extractor.aux_layer_ids)

    def path(self, i: int) -> Path:
        return self.cache_dir / self.extractor.file_name(self.samples[i])

    def missing(self, indices: Sequence[int] | None = None) -> list[int]:
        indices = range(len(self.samples)) if indices is None else indices
        return [i for i in indices if not self.path(i).is_file()]

    def prepare(self, indices: Sequence[int] | None = None, progress: Callable[[int, int], None] | None = None, chunk: int = 8) -> None:
        """Offline mode: extract every missing sample of ``indices`` (default: all) now."""
        if self.mode != ExtractionMode.OFFLINE:
            return
        todo = self.missing(indices)
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
                out = [read_sample(p, self.n_aux) for p in paths]
                for p in paths:
                    p.unlink(missing_ok=True)  # delete after use, as soon as read
                return out
        missing = self.missing(indices)
        if missing:
            if self.mode == ExtractionMode.OFFLINE:
                raise SpecUIError(f"{len(missing)} hidden-state files missing from {self.cache_dir}; run the offline extraction first")
            self.extractor.extract([self.samples[i] for i in missing], self.cache_dir)
        return [read_sample(self.path(i), self.n_aux) for i in indices]
