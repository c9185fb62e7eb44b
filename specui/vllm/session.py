"""The dashboard's vLLM slot: one server (launched or attached) shared by the
app's visitors, and one background benchmark at a time against it.

The server belongs to the browser session that launched or attached it: every
visitor sees it and may benchmark on it, but only that session (or anyone, in
admin mode) stops or replaces it; a benchmark is stopped by the session that
started it.  The rules are the store's for runs and jobs (``check_owner``).

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
from specui.errors import SpecUIError
from specui.store import Store, check_owner
from specui.vllm.bench import bench, run_benchmark
from specui.vllm.client import BenchSettings
from specui.vllm.launch_plan import ServerConfig
from specui.vllm.server import ServerState, VLLMServer, redact_url
from specui.vllm.stored_run import VLLMRun

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
    raise SpecUIError(
        "the dashboard attaches only to servers on this machine (127.0.0.1); "
        f"the operator can allow others with {ATTACH_ANY_ENV}=1"
    )


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
    owner: str | None = None  # the browser session that started it

    def log(self, message: str) -> None:
        self.messages.append(f"{time.strftime('%H:%M:%S')} {message}")
        del self.messages[:-200]


class VLLMSlot:
    """One server and one benchmark, guarded by a lock (visitors share them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.server: VLLMServer | None = None
        self.owner: str | None = None  # the browser session the server belongs to (None: anyone's)
        self.job: BenchJob | None = None
        self.last_error: str | None = None

    # -- server --

    def launch(
        self, cfg: ServerConfig, owner: str | None = None, force: bool = False
    ) -> VLLMServer:
        """Start a server in the background (replacing the session's own); ``status()``
        shows it coming up."""
        _confine_config(cfg)
        with self._lock:
            self._take(owner, force)
            server = VLLMServer.launch(cfg, wait=False)
            self.server, self.owner, self.last_error = server, owner, None

        def wait() -> None:
            try:
                server.wait_ready(cfg.startup_timeout_s)
            except SpecUIError as e:
                self.last_error = str(e)

        threading.Thread(target=wait, name="specui-vllm-wait", daemon=True).start()
        return server

    def attach(
        self,
        base_url: str,
        api_key: str | None = None,
        owner: str | None = None,
        force: bool = False,
    ) -> VLLMServer:
        check_attach_url(base_url)
        with self._lock:
            self._check_may_replace(owner, force)
            # answers, before the old one goes
            server = VLLMServer.attach(base_url, api_key=api_key)
            self._take(owner, force)
            self.server, self.owner, self.last_error = server, owner, None
            return server

    def stop(self, requester: str | None = None, force: bool = False) -> None:
        """Stop (or detach from) the server, and the benchmark running on it: its owner only."""
        with self._lock:
            running = self.job is not None and not self.job.done
            if self._live():
                self._check_owner(requester, force)
            elif running:  # between a comparison's two servers: the comparison's owner
                check_owner(
                    "the vLLM benchmark",
                    repr(self.job.description),
                    self.job.owner,
                    requester,
                    force,
                )
            if running:
                self.job.stop.set()
            server, self.server, self.owner = self.server, None, None
        if server is not None:
            server.stop()

    def stop_bench(self, requester: str | None = None, force: bool = False) -> None:
        job = self.job
        if job is not None and not job.done:
            check_owner("the vLLM benchmark", repr(job.description), job.owner, requester, force)
            job.stop.set()

    def may_change(self, requester: str | None, force: bool = False) -> bool:
        """Whether ``requester`` may stop or replace the server (False when there is none)."""
        return self._live() and (force or self.owner is None or self.owner == requester)

    def _live(self) -> bool:
        s = self.server
        return s is not None and s.state in (
            ServerState.STARTING,
            ServerState.RUNNING,
            ServerState.ATTACHED,
        )

    def _check_owner(self, requester: str | None, force: bool) -> None:
        assert self.server is not None
        check_owner(
            "the vLLM server", redact_url(self.server.base_url), self.owner, requester, force
        )

    def _check_may_replace(self, requester: str | None, force: bool) -> None:
        if self.job is not None and not self.job.done:
            raise SpecUIError("a vLLM benchmark is running; wait for it or stop it")
        if self._live():
            self._check_owner(requester, force)

    def _take(self, requester: str | None, force: bool) -> None:
        """Free the slot for ``requester`` (under the lock): stop its own live server, or
        refuse another session's."""
        self._check_may_replace(requester, force)
        old, self.server, self.owner = self.server, None, None
        if old is not None:
            old.stop()

    def status(self, requester: str | None = None, force: bool = False) -> dict:
        """State, URL, command line, log tail and the benchmark's progress.  ``mine``: the
        server belongs to ``requester`` (owners are never shown: a session id is a key)."""
        s = self.server
        job = self.job
        return {
            "server": None
            if s is None
            else {
                "state": str(s.state),
                "base_url": redact_url(s.base_url),
                "model": s.model,
                "owned": s.owned,
                "command_line": s.command_line,
                "ready_after_s": s.ready_after_s,
                "log_path": str(s.log_path) if s.log_path else None,
                "mine": self.owner is not None and self.owner == requester,
                "may_stop": self.may_change(requester, force),
            },
            "log_tail": s.log_tail(40) if s is not None else "",
            "error": self.last_error,
            "job": None
            if job is None
            else {
                "description": job.description,
                "done": job.done,
                "error": job.error,
                "run_ids": list(job.run_ids),
                "messages": list(job.messages[-15:]),
                "mine": job.owner is not None and job.owner == requester,
            },
        }

    # -- benchmarks --

    def bench_current(
        self,
        store: Store,
        *,
        prompts: str,
        limit: int | None,
        settings: BenchSettings,
        verifier: str | None,
        speculator: str | None = None,
        owner: str | None = None,
        label: str | None = None,
    ) -> BenchJob:
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
            job = self.job = BenchJob(
                f"{len(prompt_list)} prompts of {prompts} on {redact_url(server.base_url)}",
                owner=owner,
            )

        run_kw = {
            "prompt_set": prompts,
            "verifier": verifier,
            "speculator": speculator,
            "settings": settings,
            "owner": owner,
            "label": label,
        }

        def work() -> None:
            try:
                run = run_benchmark(
                    store,
                    server,
                    prompt_list,
                    should_stop=job.stop.is_set,
                    progress=lambda d, n: job.log(f"{d}/{n} prompts"),
                    **run_kw,
                )
                job.results.append(run)
                job.run_ids.append(run.run_id)
                job.log(
                    f"run {run.run_id}: {run.num_output_tokens} tokens,"
                    f" {run.aggregate_tokens_per_s:.1f} tok/s"
                )
            # shown in the tab; the run itself is marked failed
            except Exception as e:  # noqa: BLE001
                job.error = (
                    str(e)
                    if isinstance(e, SpecUIError)
                    else f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
                )
            finally:
                job.done = True

        threading.Thread(target=work, name="specui-vllm-bench", daemon=True).start()
        return job

    def bench_compare(
        self,
        store: Store,
        *,
        speculator: str,
        prompts: str,
        limit: int | None,
        settings: BenchSettings,
        cfg: ServerConfig,
        owner: str | None = None,
        force: bool = False,
    ) -> BenchJob:
        """Launch a plain server, then one with ``speculator``, benchmark both (background).
        The servers it launches are ``owner``'s, as a launch is."""
        _confine_config(cfg)
        speculator, prompts = ui_drafter(speculator), ui_prompts(prompts)
        with self._lock:
            self._take(owner, force)
            job = self.job = BenchJob(f"plain vs {speculator} on {prompts}", owner=owner)

        def on_server(server: VLLMServer | None) -> None:
            self.server, self.owner = server, owner

        def work() -> None:
            try:
                runs, _ = bench(
                    store,
                    speculators=[speculator],
                    server_config=cfg,
                    verifier=cfg.verifier,
                    num_speculative_tokens=cfg.num_speculative_tokens,
                    log=job.log,
                    should_stop=job.stop.is_set,
                    prompts=prompts,
                    limit=limit,
                    settings=settings,
                    owner=owner,
                    on_server=on_server,
                )
                job.results.extend(runs)
                job.run_ids.extend(r.run_id for r in runs)
            except Exception as e:  # noqa: BLE001 - shown in the tab
                job.error = str(e) if isinstance(e, SpecUIError) else f"{type(e).__name__}: {e}"
            finally:
                job.done = True

        threading.Thread(target=work, name="specui-vllm-compare", daemon=True).start()
        return job


SLOT = VLLMSlot()
