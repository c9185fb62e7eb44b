"""The bf16 copy of a trained drafter that ships in ``data/drafters`` (one copy of the step, for
``scripts/train_shipped_tools.py convert`` and the campaign's ship, ``campaign_ship``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_bf16(
    run: Path, dest: Path, verifier: Any, num_speculative_tokens: int | None = None
) -> int:
    """The speculators-format drafter in ``run`` (a finished run or a snapshot) written to
    ``dest`` in bf16, naming the verifier by its hub id; the bytes written.

    ``num_speculative_tokens`` overrides the K it drafts (EAGLE-3 trains 4 TTT steps but ships
    drafting 8, like the others).  A frozen embedding is the verifier's own: it is left out of
    the file, and SpecUI and vLLM borrow it."""
    from specui.algorithms.base import verifier_identity
    from specui.algorithms.checkpoint import load_model, save_drafter
    from specui.verifier.embedded import EMBEDDED_HUB_ID

    model = load_model(run, verifier)
    model.config.verifier_name_or_path = EMBEDDED_HUB_ID  # not this machine's cache path
    # A run trained before the GGUF-config fix recorded no verifier architecture: name it.
    arch = verifier_identity(verifier)["verifier_architectures"]
    model.config.verifier_architectures = model.config.verifier_architectures or arch
    if num_speculative_tokens:
        model.config.num_speculative_tokens = num_speculative_tokens
    embed = "embed_tokens.weight"
    frozen = embed in model.verifier_fallback and not model.get_parameter(embed).requires_grad
    save_drafter(model, dest, dtype="bfloat16", borrow=(embed,) if frozen else ())
    return sum(f.stat().st_size for f in dest.iterdir() if f.is_file())
