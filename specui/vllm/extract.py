"""Verifier hidden states for training, extracted by a vLLM server.

``VLLMExtractor`` implements ``specui.data.hidden.HiddenStateExtractor``: it
serves the verifier with vLLM's ``extract_hidden_states`` speculative method
and a hidden-states KV connector, sends each sample's token ids as a prompt
(one output token, which is discarded) and turns the file vLLM writes into
the same layout file ``LocalExtractor`` writes -- same name, tensor names,
shapes, dtypes and metadata, through the same ``write_sample`` -- so a cache
filled by either is read by the trainer alike.

vLLM captures the residual stream *entering* decoder layer L as layer id L
(0 = embeddings, N = after the last layer, before the final norm): the
``tap[L]`` convention of ``specui.verifier``.  It returns the requested layers
in ascending order, once each; the extractor puts them back in
``aux_layer_ids + [N]`` order.

On a CPU build the connector is ``specui.vllm.connector`` (vLLM's own one
needs CUDA); on a GPU build it is vLLM's ``ExampleHiddenStatesConnector``.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import httpx
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from specui.data.distill import TokenSample, verifier_fingerprint
from specui.data.hidden import HiddenStateExtractor, TargetFn, topk_targets, write_sample
from specui.errors import SpecUIError
from specui.paths import REPO_ROOT
from specui.vllm.install import is_cpu_build, vllm_python
from specui.vllm.launch_plan import ServerConfig, resolve_model
from specui.vllm.server import VLLMServer, redact_url

CPU_CONNECTOR = "SpecUICPUHiddenStatesConnector"
CPU_CONNECTOR_MODULE = "specui.vllm.connector"
GPU_CONNECTOR = "ExampleHiddenStatesConnector"


def extraction_config(base: ServerConfig, layer_ids: Sequence[int], storage: Path) -> ServerConfig:
    """``base`` turned into a hidden-state extraction server writing into ``storage``."""
    cpu = is_cpu_build(vllm_python(base.python))
    kv: dict = {
        "kv_connector": CPU_CONNECTOR if cpu else GPU_CONNECTOR,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
    }
    env = dict(base.env)
    if cpu:
        kv["kv_connector_module_path"] = CPU_CONNECTOR_MODULE
        env["PYTHONPATH"] = str(REPO_ROOT)  # so vLLM's workers can import specui.vllm.connector
    spec = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {
            "hf_config": {"eagle_aux_hidden_state_layer_ids": sorted(set(layer_ids))}
        },
    }
    # No speculator of its own, and no prefix caching: a cache hit would skip computing (and so
    # capturing) the shared positions' hidden states.
    plain = {"speculator": None, "num_speculative_tokens": None, "enable_prefix_caching": False}
    return replace(base, speculative_config=spec, kv_transfer_config=kv, env=env, **plain)


class VLLMExtractor(HiddenStateExtractor):
    """Hidden states through a vLLM server this extractor launches (and stops in ``close``).

    ``fingerprint`` and ``num_layers`` must describe the verifier exactly as
    ``LocalExtractor`` would (they name the cache files); ``from_verifier``
    takes them from a loaded ``specui.verifier.Verifier``.
    """

    def __init__(
        self,
        model: str,
        aux_layer_ids: Sequence[int],
        *,
        num_layers: int,
        fingerprint: str,
        server_config: ServerConfig | None = None,
        concurrency: int = 4,
        on_launch: Callable[[VLLMServer], None] | None = None,
        targets: TargetFn | None = None,
    ) -> None:
        bad = [i for i in aux_layer_ids if not 0 <= i <= num_layers]
        if bad:
            raise SpecUIError(
                f"aux hidden-state layer ids {bad} out of range for a verifier with {num_layers}"
                f" layers (0..{num_layers})"
            )
        self.model = resolve_model(model)
        self.aux_layer_ids = list(aux_layer_ids)
        self.num_layers = num_layers
        self.fingerprint = fingerprint
        self.concurrency = max(1, concurrency)
        self._base = server_config or ServerConfig()
        self._on_launch = (
            on_launch  # told of each server started (a trainer logs its pid and log file)
        )
        # The verifier's head, so each file gets its targets as a local extraction's does;
        # None leaves them to the store, which adds them when it first reads the file.
        self.targets = targets
        self._server: VLLMServer | None = None
        self._storage: Path | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_verifier(
        cls, verifier_choice: str, verifier, aux_layer_ids: Sequence[int] | None = None, **kw
    ) -> VLLMExtractor:
        """For ``verifier`` (loaded from ``verifier_choice``: embedded or a folder)."""
        aux = list(aux_layer_ids) if aux_layer_ids is not None else verifier.default_aux_layer_ids()
        verifier.check_aux_layer_ids(aux)
        kw.setdefault("targets", lambda h: topk_targets(verifier, h))
        return cls(
            verifier_choice,
            aux,
            num_layers=verifier.num_layers,
            fingerprint=verifier_fingerprint(verifier),
            **kw,
        )

    # -- the server --

    @property
    def server(self) -> VLLMServer:
        """The extraction server, started on first use."""
        with self._lock:
            if self._server is None or self._server.state == "exited":
                if self._server is not None:
                    self._server.stop()
                self._storage = Path(tempfile.mkdtemp(prefix="specui-vllm-hidden-"))
                cfg = extraction_config(
                    replace(self._base, verifier=self.model), self.layer_ids, self._storage
                )
                server = VLLMServer.launch(cfg)
                server.add_scratch(self._storage)
                self._server = server
                if self._on_launch is not None:
                    self._on_launch(server)
            return self._server

    def close(self) -> None:
        with self._lock:
            if self._server is not None:
                self._server.stop()
                self._server = None

    def __enter__(self) -> VLLMExtractor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- extraction --

    def extract(self, samples: Sequence[TokenSample], out_dir: Path) -> list[Path]:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        server = self.server
        with (
            server.client(
                600.0, limits=httpx.Limits(max_connections=self.concurrency + 2)
            ) as client,
            ThreadPoolExecutor(self.concurrency, thread_name_prefix="specui-vllm-extract") as pool,
        ):
            return list(pool.map(lambda s: self._extract_one(server, client, s, out_dir), samples))

    def _extract_one(
        self, server: VLLMServer, client: httpx.Client, sample: TokenSample, out_dir: Path
    ) -> Path:
        ids = list(sample.input_ids)
        if not ids:
            raise SpecUIError(f"sample {sample.id} has no tokens")
        body = {"model": server.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
        try:
            r = client.post("/v1/completions", json=body)
        except httpx.HTTPError as e:
            server.check_alive()
            raise SpecUIError(
                f"the vLLM extraction server at {redact_url(server.base_url)} failed:"
                f" {type(e).__name__}: {e}"
            ) from None
        if r.status_code != 200:
            raise SpecUIError(
                f"the vLLM server refused sample {sample.id} ({r.status_code}): {r.text[:300]}"
            )
        params = r.json().get("kv_transfer_params") or {}
        src = params.get("hidden_states_path")
        if not src:
            raise SpecUIError(
                "the vLLM server returned no hidden_states_path: is it serving with a hidden-states"
                " KV connector?"
            )
        try:
            data = _read_locked(Path(src))
        finally:
            for p in (Path(src), Path(src + ".lock")):
                p.unlink(missing_ok=True)
        token_ids = data["token_ids"].long()
        if token_ids.tolist() != ids:
            raise SpecUIError(
                f"sample {sample.id}: vLLM returned hidden states of other tokens than it was sent"
            )
        hs = data["hidden_states"]  # [T, n_unique_layers, H], ascending layer ids
        unique = sorted(set(self.layer_ids))
        if hs.dim() != 3 or hs.shape[0] != len(ids) or hs.shape[1] != len(unique):
            raise SpecUIError(
                f"sample {sample.id}: vLLM wrote hidden states of shape {tuple(hs.shape)}, "
                f"expected [{len(ids)}, {len(unique)}, H]"
            )
        taps = hs[
            :, [unique.index(i) for i in self.layer_ids]
        ]  # file order: aux layers, then tap[N]
        path = out_dir / self.file_name(sample)
        target_ids, target_logprobs = (
            self.targets(taps[:, -1].float()) if self.targets else (None, None)
        )
        write_sample(
            path,
            taps,
            token_ids,
            torch.tensor(sample.loss_mask, dtype=torch.long),
            {"verifier": self.fingerprint, "layer_ids": str(self.layer_ids)},
            target_ids=target_ids,
            target_logprobs=target_logprobs,
        )
        return path


def _read_locked(path: Path) -> dict[str, torch.Tensor]:
    """Read a file the connector writes after answering: its ``.lock`` file is
    held exclusively until the write is complete, so a shared lock waits for it."""
    lock = Path(str(path) + ".lock")
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        fd = None  # no lock file: the writer does not use one, the file is complete
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_SH)
        return load_file(str(path))
    except (OSError, SafetensorError) as e:
        raise SpecUIError(f"cannot read the hidden states vLLM wrote to {path}: {e}") from None
    finally:
        if fd is not None:
            os.close(fd)
