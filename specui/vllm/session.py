"""The dashboard's vLLM slot: one server (launched or attached) shared by the
app's visitors, and one background benchmark at a time against it.

The library side of ``specui.ui.vllm_tab``: every action there is one call
here, so it works (and is tested) without a browser.
"""

from __future__ import annotations

import ipaddress
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from specui.choices import ui_drafter, ui_prompts, ui_verifier
from specui.data import load_prompts
from specui.store import Store
from specui.trace import SpecUIError
from specui.vllm.bench import BenchSettings, VLLMRun, bench, run_benchmark
from specui.vllm.server import ServerConfig, ServerState, VLLMServer, redact_url

# Attaching makes the app send requests to a URL a visitor typed; by default
# only to this machine, so the dashboard cannot be used to probe a network.
ATTACH_ANY_ENV = "SPECUI_VLLM_ATTACH_ANY"


def check_attach_url(url: str) -> None:
    host = (urlsplit(url.strip()).hostname or "").lower()
    if os.environ.get(ATTACH_ANY_ENV) == "1" or host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise SpecUIError(f"the dashboard attaches only to servers on this machine (127.0.0.1); the operator can allow others with {ATTACH_ANY_ENV}=1")


def _confine_config(cfg: ServerConfig) -> None:
    """The slot serves the dashboard's visitors: what they name stays in the app's folders."""
    cfg.verifier = ui_verifier(cfg.verifier)
    if cfg.speculator is not None:
        cfg.speculator = ui_drafter(cfg.speculator)


@dataclass
class BenchJob:
    """A benchmark running in a background thread of the app."""

    description: str
    started_at: float = field(default_factory=time.time)
    messages: list[str] = field(default_factory=list)
    run_ids: list[int] = field(default_factory=list)
    results: list[VLLMRun] = field(default_factory=list)
    error: str | None = None
    done: bool = False
    stop: threading.Event = field(default_factory=threading.Event)

    def log(self, message: str) -> None:
        self.messages.append(f"{time.strftime('%H:%M:%S')} {message}")
        del self.messages[:-200]


class VLLMSlot:
    """One server and one benchmark, guarded by a lock (visitors share them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.server: VLLMServer | None = None
        self.job: BenchJob | None = None
        self.last_error: str | None = None

    # -- server --

    def launch(self, cfg: ServerConfig) -> VLLMServer:
        """Start a server in the background; ``status()`` shows it coming up."""
        _confine_config(cfg)
        with self._lock:
            self._check_free()
            server = VLLMServer.launch(cfg, wait=False)
            self.server, self.last_error = server, None

        def wait() -> None:
            try:
                server.wait_ready(cfg.startup_timeout_s)
            except SpecUIError as e:
                self.last_error = str(e)

        threading.Thread(target=wait, name="specui-vllm-wait", daemon=True).start()
        return server

    def attach(self, base_url: str, api_key: str | None = None) -> VLLMServer:
        check_attach_url(base_url)
        with self._lock:
            self._check_free()
            self.server = VLLMServer.attach(base_url, api_key=api_key)
            self.last_error = None
            return self.server

    def stop(self) -> None:
        with self._lock:
            if self.job is not None and not self.job.done:
                self.job.stop.set()
            server, self.server = self.server, None
        if server is not None:
            server.stop()

    def _check_free(self) -> None:
        if self.server is not None and self.server.state in (ServerState.STARTING, ServerState.RUNNING, ServerState.ATTACHED):
            raise SpecUIError("a vLLM server is already in use here; stop it first")
        if self.job is not None and not self.job.done:
            raise SpecUIError("a vLLM benchmark is running; wait for it or stop it")

    def status(self) -> dict:
        """State, URL, command line, log tail and the benchmark's progress."""
        s = self.server
        job = self.job
        return {
            "server": None if s is None else {
                "state": str(s.state), "base_url": redact_url(s.base_url), "model": s.model, "owned": s.owned,
                "command_line": s.command_line, "ready_after_s": s.ready_after_s, "log_path": str(s.log_path) if s.log_path else None,
            },
            "log_tail": s.log_tail(40) if s is not None else "",
            "error": self.last_error,
            "job": None if job is None else {
                "description": job.description, "done": job.done, "error": job.error, "run_ids": list(job.run_ids),
                "messages": list(job.messages[-15:]),
            },
        }

    # -- benchmarks --

    def bench_current(self, store: Store, *, prompts: str, limit: int | None, settings: BenchSettings, verifier: str | None,
                      speculator: str | None = None, owner: str | None = None, label: str | None = None) -> BenchJob:
        """Benchmark the current server in the background (one run)."""
        prompts = ui_prompts(prompts)
        with self._lock:
            server = self.server
            if server is None:
                raise SpecUIError("launch or attach a vLLM server first")
            if server.state == ServerState.STARTING:
                raise SpecUIError("the server is still starting; try again when it is running")
            server.check_alive()
            if self.job is not None and not self.job.done:
                raise SpecUIError("a vLLM benchmark is already running")
            prompt_list = load_prompts(prompts, split="eval", limit=limit)
            if not prompt_list:
                raise SpecUIError(f"prompt set {prompts!r} has no prompts")
            job = self.job = BenchJob(f"{len(prompt_list)} prompts of {prompts} on {redact_url(server.base_url)}")

        def work() -> None:
            try:
                run = run_benchmark(store, server, prompt_list, prompt_set=prompts, verifier=verifier, speculator=speculator,
                                    settings=settings, owner=owner, label=label, should_stop=job.stop.is_set,
                                    progress=lambda d, n: job.log(f"{d}/{n} prompts"))
                job.results.append(run)
                job.run_ids.append(run.run_id)
                job.log(f"run {run.run_id}: {run.num_output_tokens} tokens, {run.aggregate_tokens_per_s:.1f} tok/s")
            except Exception as e:  # noqa: BLE001 - shown in the tab; the run itself is marked failed
                job.error = str(e) if isinstance(e, SpecUIError) else f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
            finally:
                job.done = True

        threading.Thread(target=work, name="specui-vllm-bench", daemon=True).start()
        return job

    def bench_compare(self, store: Store, *, speculator: str, prompts: str, limit: int | None, settings: BenchSettings,
                      cfg: ServerConfig, owner: str | None = None) -> BenchJob:
        """Launch a plain server, then one with ``speculator``, benchmark both (background)."""
        _confine_config(cfg)
        speculator, prompts = ui_drafter(speculator), ui_prompts(prompts)
        with self._lock:
            self._check_free()
            job = self.job = BenchJob(f"plain vs {speculator} on {prompts}")

        def on_server(server: VLLMServer | None) -> None:
            self.server = server

        def work() -> None:
            try:
                runs, _ = bench(store, speculators=[speculator], prompts=prompts, limit=limit, verifier=cfg.verifier,
                                settings=settings, num_speculative_tokens=cfg.num_speculative_tokens, server_config=cfg,
                                owner=owner, log=job.log, should_stop=job.stop.is_set, on_server=on_server)
                job.results.extend(runs)
                job.run_ids.extend(r.run_id for r in runs)
            except Exception as e:  # noqa: BLE001 - shown in the tab
                job.error = str(e) if isinstance(e, SpecUIError) else f"{type(e).__name__}: {e}"
            finally:
                job.done = True

        threading.Thread(target=work, name="specui-vllm-compare", daemon=True).start()
        return job


SLOT = VLLMSlot()
