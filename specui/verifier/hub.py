"""Hub ids: which the app's visitors may load, and how big a hub model is before any download.

The CLI is the operator's own tool and loads any hub id.  The web app refuses hub ids unless
the operator allows them (app.py ``--allow-hub``, ``SPECUI_ALLOW_HUB``): ``1`` (or ``*``)
allows every id, anything else is a comma-separated allow-list of ids or ``fnmatch``
patterns (``HuggingFaceTB/*,Qwen/Qwen3-0.6B``).

Where hub loads are allowed, ``hub_weights`` reads a model's size from the hub's metadata --
its file list and the headers of its safetensors files (a ranged read of each file's first
bytes, through ``huggingface_hub``) -- so a load over the cap is refused before any weight is
fetched (``specui.verifier.admission``).
"""

from __future__ import annotations

import fnmatch
import os
import threading
from pathlib import Path

from specui.errors import SpecUIError
from specui.verifier import loading
from specui.verifier.admission import Weights, check_fits, header_weights, size_text

ALLOW_ENV = "SPECUI_ALLOW_HUB"
SWITCH = f"--allow-hub or {ALLOW_ENV}"
# Seconds a metadata request may take: a visitor waits on it, and an unreachable hub must
# give a clear error soon, not after the client's retries.
METADATA_TIMEOUT_S = 10.0


def allow_list() -> list[str] | None:
    """The operator's allowed hub ids or patterns: None when hub loads are off, ``["*"]``
    when any id is allowed."""
    value = os.environ.get(ALLOW_ENV, "").strip()
    if value in ("", "0"):
        return None
    if value == "1":
        return ["*"]
    return [p.strip() for p in value.split(",") if p.strip()]


def check_hub_allowed(spec: str, kind: str) -> None:
    """Refuse a visitor's hub id (``kind``: verifier, speculator) the operator has not allowed.

    Nothing is asked of the hub, and nothing is written to its cache, before this passes."""
    allowed = allow_list()
    if allowed is None:
        raise SpecUIError(
            f"{kind} {spec!r} names a hub model: this app loads hub models only where the"
            f" operator allows it ({SWITCH}); pick a model in the list or a folder in the"
            " app's data folder"
        )
    if not any(fnmatch.fnmatchcase(spec, pattern) for pattern in allowed):
        raise SpecUIError(
            f"{kind} {spec!r} is not among the hub models the operator allows here"
            f" ({', '.join(allowed)}; set with {SWITCH})"
        )


# Successful size look-ups, so a visitor's every Generate does not ask the hub again.
_sizes: dict[str, tuple[Weights, int]] = {}
_sizes_lock = threading.Lock()
_SIZES_KEPT = 256


def hub_weights(repo_id: str) -> tuple[Weights, int]:
    """(the weights, the bytes a download fetches) of hub model ``repo_id``, from the hub's
    metadata only: its file list (with sizes) and its safetensors headers.

    A repository without safetensors weights is refused: SpecUI never unpickles a
    ``.bin`` checkpoint."""
    with _sizes_lock:
        if repo_id in _sizes:
            return _sizes[repo_id]
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, NotASafetensorsRepoError

    api = HfApi()
    try:
        info = api.model_info(repo_id, files_metadata=True, timeout=METADATA_TIMEOUT_S)
        files = {s.rfilename: int(s.size or 0) for s in info.siblings or []}
        if not any(name.endswith(".safetensors") for name in files):
            raise SpecUIError(
                f"hub model {repo_id!r} has no safetensors weights (SpecUI loads no others)"
            )
        meta = api.get_safetensors_metadata(repo_id, timeout=METADATA_TIMEOUT_S)
    except SpecUIError:
        raise
    except NotASafetensorsRepoError:
        raise SpecUIError(
            f"hub model {repo_id!r} has no safetensors weights (SpecUI loads no others)"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        # Not found, gated, unreachable, timed out: one line, no traceback.
        raise SpecUIError(
            f"cannot read the size of hub model {repo_id!r} ({type(e).__name__}); it is not loaded"
        ) from None
    weights = Weights(0, 0)
    for file_meta in meta.files_metadata.values():
        weights += header_weights(
            {name: {"dtype": t.dtype, "shape": t.shape} for name, t in file_meta.tensors.items()}
        )
    download = sum(size for name, size in files.items() if _fetched(name))
    with _sizes_lock:
        if len(_sizes) >= _SIZES_KEPT:
            _sizes.pop(next(iter(_sizes)))
        _sizes[repo_id] = (weights, download)
    return weights, download


# What a load fetches from a hub repository: safetensors weights, configs, tokenizer files.
FETCHED = ("*.safetensors", "*.json", "*.txt", "*.model", "*.md", "*.jinja")


def _fetched(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in FETCHED)


def check_disk(repo_id: str, download: int) -> None:
    """Refuse a download the hub cache's disk cannot hold (less a 1 GB margin)."""
    import shutil

    from huggingface_hub import constants

    cache = Path(constants.HF_HUB_CACHE)
    probe = next((p for p in (cache, *cache.parents) if p.exists()), Path("/"))
    free = shutil.disk_usage(probe).free
    if download > free - 10**9:
        raise SpecUIError(
            f"hub model {repo_id!r} downloads {size_text(download)}; the disk holding the hub"
            f" cache has {size_text(max(0, free - 10**9))} to spare"
        )


def download(repo_id: str) -> Path:
    """Fetch hub model ``repo_id``'s safetensors weights, configs and tokenizer files into the
    hub cache and return the folder (a snapshot); the caller has admitted its size."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=list(FETCHED)))
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise SpecUIError(
            f"cannot download hub model {repo_id!r} ({type(e).__name__}: {e})"
        ) from None


def fetch(repo_id: str, kind: str) -> Path:
    """The local snapshot of hub model ``repo_id`` (``kind``: verifier, speculator), its size
    read from the hub's metadata and admitted (memory, the operator's cap, disk) before any
    weight is fetched."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:  # the cache only: the load admits the folder's own headers
        return download(repo_id)
    weights, size = hub_weights(repo_id)
    check_fits(f"{kind} {repo_id}", weights)
    check_disk(repo_id, size)
    with loading.stage(repo_id, f"downloading {size_text(size)} from the hub"):
        return download(repo_id)
