"""What a learned drafter loaded to serve decodes need not keep.

Beside a bf16, int8 or GGUF verifier ``resolve_drafter`` switches a drafter's matmuls to the
kernels (``LearnedDrafter.matmuls_in_bf16``): each linear then multiplies by its packed copies
(oneDNN's bf16 layout, the bf16 kernel's, and beside ``gguf-q8`` the one call's Q8_0 blocks),
and q/k/v and gate/up by a stacked linear built from them.  Two things stay from the float32
load that nothing on that path reads:

- every converted linear's float32 ``weight`` (``BF16Linear.forward`` and the one-call layers
  read only the packed copies; the stacked linears were built already); and
- the float32 copy of the verifier's embedding that an EAGLE-3 or P-EAGLE checkpoint borrows
  (``verifier_fallback``): V x H floats, 108 MiB beside SmolLM2, equal to the verifier's own
  table, which serves the lookups as well.

``drop_load_copies`` lets both go: about half of what a shipped drafter holds (199-322 MiB ->
60-223 MiB beside the embedded verifier; ``docs/space.md``).  Only for a drafter that serves
decodes: training builds its own model (``load_model`` / ``create``) and never sees it, and
nothing trains, saves or re-packs a drafter after ``matmuls_in_bf16`` (its linears' forward
has no gradient for their weights).  A dropped weight becomes a tensor on the meta device (its
shape and no memory), so code that still tried to compute with one fails loudly instead of
reading stale values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from specui.algorithms.checkpoint import checkpoint_model_class, read_checkpoint_config
from specui.algorithms.layers import MLP, Attention
from specui.verifier.admission import Weights, folder_weights
from specui.verifier.fingerprint import model_fingerprint


def _linears(drafter: Any) -> list[nn.Module]:
    """Every linear the drafter holds: its model's, those it keeps outside its modules, and
    the stacked q/k/v, k/v and gate/up ones (held beside the modules, not in them)."""
    found: dict[int, nn.Module] = {}
    for root in (drafter.model, *drafter.model.own_matmuls_outside()):
        for module in root.modules():
            if isinstance(module, nn.Linear):
                found[id(module)] = module
            if isinstance(module, Attention | MLP) and module.stacked is not None:
                for linear in (module.stacked.first, module.stacked.second):
                    if linear is not None:
                        found[id(linear)] = linear
    return list(found.values())


def drop_float_weights(drafter: Any) -> int:
    """Replace the float32 ``weight`` of each linear that multiplies by a packed copy with a
    bf16 tensor on the meta device; returns the bytes let go."""
    from specui.verifier.batch_invariant import BF16Linear

    freed = 0
    for linear in _linears(drafter):
        w = linear.weight
        if not isinstance(linear, BF16Linear) or not linear.is_packed or w.is_meta:
            continue
        freed += w.numel() * w.element_size()
        placeholder = torch.empty(w.shape, dtype=torch.bfloat16, device="meta")
        linear.weight = nn.Parameter(placeholder, requires_grad=False)
    return freed


def share_verifier_embedding(drafter: Any, verifier: Any) -> int:
    """Point the drafter's own ``embed_tokens`` at the verifier's table where the two are the
    same float32 values (a borrowed one: a trained embedding differs and stays); returns the
    bytes let go."""
    embed = getattr(drafter.model, "embed_tokens", None)
    theirs = getattr(getattr(verifier, "embed_tokens", None), "weight", None)
    if not isinstance(embed, nn.Embedding) or not isinstance(theirs, torch.Tensor):
        return 0
    mine = embed.weight
    if (
        theirs.is_meta
        or theirs.dtype != mine.dtype
        or theirs.shape != mine.shape
        or theirs.data_ptr() == mine.data_ptr()
        or not torch.equal(theirs, mine)
    ):
        return 0
    freed = mine.numel() * mine.element_size()
    embed.weight = nn.Parameter(theirs.detach(), requires_grad=False)
    return freed


def drop_load_copies(drafter: Any, verifier: Any) -> int:
    """Both of the above, for a learned drafter whose matmuls run on the kernels
    (``matmuls_in_bf16`` done); returns the bytes let go.

    The weights' fingerprint (what the cost model files a drafter's draft time under:
    ``specui.policy.cost.drafter_key``) is taken first and kept on the drafter: it reads the
    float32 values, and is the same one the drafter had with them."""
    drafter.weights_fingerprint = model_fingerprint(drafter.model)
    return drop_float_weights(drafter) + share_verifier_embedding(drafter, verifier)


# Bytes a linear's element costs a drafter serving beside a kernel verifier (bf16, int8, GGUF):
# two bf16 copies (oneDNN's and the kernel's, 4), the stacked q/k/v and gate/up ones (their
# share, about 2) and beside gguf-q8 its Q8_0 blocks (about 1).  Measured on the shipped
# drafters beside gguf-q8 (bench/drafter_memory.py, docs/space.md): within 10% of what they
# hold, DSpark's 11% under its resident size (its Markov chain keeps a bf16 table of its own).
SERVING_BYTES = 7
# ...and at the worst moment of such a load: the float32 weights and the conversions' copies
# and temporaries side by side before the float32 ones go (measured: the shipped drafters'
# peaks 6% under to 20% over this estimate).
CONVERTING_BYTES = 14


def load_weights(folder: Path, verifier: Any) -> Weights:
    """A drafter load's memory, from its checkpoint's headers and its config (the model built
    on the meta device: shapes, no memory): what it holds once serving beside ``verifier``
    (``resident``) and at the worst moment of the load (``peak``).

    The float32 model counts what the checkpoint stores and what the load takes from the
    verifier (a borrowed embedding or head: ``verifier_fallback``, ``bound_elements``); beside a
    kernel verifier the linears are then converted (``SERVING_BYTES`` each element once served,
    ``CONVERTING_BYTES`` while converting) and an embedding equal to the verifier's is shared."""
    stored = folder_weights(folder)
    d = read_checkpoint_config(folder)
    model_cls = checkpoint_model_class(d)
    config = model_cls.config_class.from_dict(d)
    with torch.device("meta"):
        model = model_cls(config)
    bound = getattr(model_cls, "bound_elements", lambda _: 0)(config)
    elements = sum(t.numel() for t in model.state_dict().values()) + bound
    if getattr(verifier, "precision", "fp32") not in ("bf16", "int8", "gguf", "gguf-q8"):
        return Weights(elements, stored.stored_bytes)  # float32 serving: the float32 rule
    linear = bound + sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    embed = getattr(model, "embed_tokens", None)
    shared = embed.weight.numel() if "embed_tokens.weight" in model_cls.verifier_fallback else 0
    own = elements - linear - (shared if isinstance(embed, nn.Embedding) else 0)
    return Weights(
        elements,
        stored.stored_bytes,
        resident=SERVING_BYTES * linear + 4 * own,
        peak=stored.stored_bytes + 4 * elements + CONVERTING_BYTES * linear,
    )
