"""A vLLM OpenAI-compatible server that SpecUI launches and owns, or one it attaches to.

Launching (the configuration and its checks are ``launch_plan.py``)::

    cfg = ServerConfig(verifier="embedded", speculator="/path/to/dflash", num_speculative_tokens=4)
    with VLLMServer.launch(cfg) as server:      # waits for /health
        print(server.command_line, server.base_url)
    # the server's whole process group is gone here

The server runs ``python -m vllm.entrypoints.openai.api_server`` from vLLM's
own virtualenv (``.venv-vllm``; vLLM pins torch and transformers versions the
app's environment may not want), under ``watchdog.py``, which stops the whole
process group when this process goes away by any means, SIGKILL included.
``stop()`` and an atexit hook stop it earlier and more gently.

Attaching::

    server = VLLMServer.attach("http://gpu-box:8000", api_key=...)

The API key goes into request headers only: it is never logged, stored with
a run, or shown in ``repr``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from specui.errors import SpecUIError
from specui.paths import REPO_ROOT, data_dir
from specui.vllm.install import check_installed
from specui.vllm.launch_plan import LaunchPlan, ServerConfig, plan_launch
from specui.vllm.watchdog import group_alive

log = logging.getLogger(__name__)


class ServerState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"  # stopped by us
    EXITED = "exited"  # died on its own
    ATTACHED = "attached"  # someone else's server


# --- the server handle -----------------------------------------------------------------


def redact_url(url: str) -> str:
    """``url`` without user:password@ (safe to show and store)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


_LIVE: weakref.WeakSet[VLLMServer] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop()


class VLLMServer:
    """A running vLLM server: launched (and owned) by this process, or attached."""

    def __init__(
        self, base_url: str, *, api_key: str | None = None, plan: LaunchPlan | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.__api_key = api_key  # name-mangled: kept out of vars()-based dumps
        self.plan = plan
        self.model: str | None = plan.model if plan else None
        self.log_path: Path | None = None
        self.started_at = time.time()
        self.ready_after_s: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid_file: Path | None = None
        self._server_pid: int | None = None
        self._state = ServerState.ATTACHED if plan is None else ServerState.STARTING
        self._lock = threading.Lock()
        self._scratch: list[Path] = []  # folders removed with the server
        self._grace = 20.0

    def __repr__(self) -> str:
        return f"VLLMServer({redact_url(self.base_url)!r}, state={self.state})"

    # -- constructors --

    @classmethod
    def launch(cls, cfg: ServerConfig, *, wait: bool = True) -> VLLMServer:
        """Start a server for ``cfg``; with ``wait``, return once /health answers."""
        plan = plan_launch(cfg)
        check_installed(Path(plan.argv[0]))
        server = cls(f"http://{_url_host(plan.host)}:{plan.port}", api_key=plan.api_key, plan=plan)
        server._start(cfg)
        if wait:
            try:
                server.wait_ready(cfg.startup_timeout_s)
            except BaseException:
                server.stop()
                raise
        return server

    @classmethod
    def attach(
        cls, base_url: str, *, api_key: str | None = None, timeout_s: float = 10.0
    ) -> VLLMServer:
        """A server someone else runs; checks it answers and learns its model name."""
        url = base_url.strip().rstrip("/")
        if url.endswith("/v1"):
            url = url[:-3]
        if not url.startswith(("http://", "https://")):
            raise SpecUIError(
                f"base URL must start with http:// or https://, got {redact_url(url)!r}"
            )
        server = cls(url, api_key=api_key or None)
        server.model = server.served_model(timeout_s)
        return server

    # -- process management --

    def _start(self, cfg: ServerConfig) -> None:
        assert self.plan is not None
        log_dir = Path(cfg.log_path).expanduser().parent if cfg.log_path else data_dir() / "vllm"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = (
            Path(cfg.log_path).expanduser()
            if cfg.log_path
            else log_dir / f"server-{self.plan.port}.log"
        )
        self._pid_file = Path(tempfile.mkstemp(prefix="specui-vllm-", suffix=".pid")[1])
        self._pid_file.unlink()
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
        env.update(self.plan.env)
        env["PYTHONUNBUFFERED"] = "1"
        watchdog = Path(__file__).with_name("watchdog.py")
        argv = [
            sys.executable,
            str(watchdog),
            "--pid-file",
            str(self._pid_file),
            "--grace",
            str(cfg.stop_grace_s),
            "--",
            *self.plan.argv,
        ]
        with open(self.log_path, "ab") as logf:
            logf.write(f"\n=== specui: {self.plan.command_line}\n".encode())
            logf.flush()
            # stdin is the lifeline: only we hold its write end (see watchdog.py).
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(REPO_ROOT),
                start_new_session=True,
            )
        self._state = ServerState.STARTING
        self._grace = cfg.stop_grace_s
        _LIVE.add(self)
        log.info("vLLM server starting on %s (log %s)", self.base_url, self.log_path)

    @property
    def owned(self) -> bool:
        return self.plan is not None

    @property
    def server_pid(self) -> int | None:
        """The pid (= process group id) of the vLLM API server, once started."""
        if self._server_pid is None and self._pid_file is not None:
            with contextlib.suppress(OSError, ValueError):
                self._server_pid = int(self._pid_file.read_text())
        return self._server_pid

    @property
    def watchdog_pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def state(self) -> ServerState:
        if (
            self._state in (ServerState.STARTING, ServerState.RUNNING)
            and self._proc is not None
            and self._proc.poll() is not None
        ):
            self._state = ServerState.EXITED
        return self._state

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    @property
    def command_line(self) -> str | None:
        return self.plan.command_line if self.plan else None

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's log ('' for attached servers)."""
        if self.log_path is None or not self.log_path.is_file():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * lines))
            text = f.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        """Block until /health answers 200; a SpecUIError with the log tail if the
        server dies or ``timeout_s`` passes first."""
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        with httpx.Client(timeout=5.0) as client:
            while True:
                if self.state == ServerState.EXITED:
                    raise SpecUIError(self._died_message("exited while starting"))
                try:
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    tail = self.log_tail(25)
                    self.stop()
                    raise SpecUIError(
                        f"the vLLM server did not answer /health within {timeout_s:.0f} s; last log"
                        f" lines:\n{tail}"
                    )
                time.sleep(0.5)
        self.ready_after_s = time.monotonic() - t0
        self._state = ServerState.RUNNING
        log.info("vLLM server ready on %s after %.1f s", self.base_url, self.ready_after_s)

    def _died_message(self, what: str) -> str:
        code = self.returncode
        tail = self.log_tail(25)
        hint = ""
        if "unrecognized arguments" in tail and "--per-request-spec-decode-metrics" in tail:
            hint = (
                "\nThis vLLM predates per-request speculative-decoding metrics: launch with"
                " --spec-decode-metrics none (ServerConfig.spec_decode_metrics='none'); runs then"
                " get tau and a_k from the Prometheus counters only."
            )
        return (
            f"the vLLM server {what} (exit code {code}); last log lines"
            f" ({self.log_path}):\n{tail}{hint}"
        )

    def check_alive(self) -> None:
        """Raise a SpecUIError naming the log tail if an owned server has died."""
        if self.owned and self.state == ServerState.EXITED:
            raise SpecUIError(self._died_message("has exited"))

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop an owned server (SIGTERM, then SIGKILL of its process group) and
        wait until every process of it is gone.  Detaches from an attached one."""
        with self._lock:
            _LIVE.discard(self)
            if self._proc is None:
                if self._state == ServerState.ATTACHED:
                    self._state = ServerState.STOPPED
                return
            grace = self._grace
            pgid = self.server_pid
            if self._proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self._proc.stdin.close()  # EOF on the lifeline: the watchdog stops the group
            try:
                self._proc.wait(timeout=timeout_s or grace + 10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if pgid is not None and group_alive(pgid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            if self._state != ServerState.EXITED:
                self._state = ServerState.STOPPED
            for folder in self._scratch:
                shutil.rmtree(folder, ignore_errors=True)
            self._scratch.clear()
            if self._pid_file is not None:
                self._pid_file.unlink(missing_ok=True)

    def add_scratch(self, folder: Path) -> None:
        """A folder to delete when the server stops (extraction scratch space)."""
        self._scratch.append(folder)

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- HTTP --

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.__api_key}"} if self.__api_key else {}

    def client(self, timeout_s: float = 600.0, **kw: Any) -> httpx.Client:
        """An httpx client for this server (base URL and auth header set)."""
        return httpx.Client(
            base_url=self.base_url,
            headers=self.headers,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            **kw,
        )

    def served_model(self, timeout_s: float = 10.0) -> str:
        """The model name the server answers to (from /v1/models)."""
        try:
            with self.client(timeout_s) as c:
                r = c.get("/v1/models")
        except httpx.HTTPError as e:
            raise SpecUIError(
                f"cannot reach a vLLM server at {redact_url(self.base_url)}:"
                f" {type(e).__name__}: {e}"
            ) from None
        if r.status_code in (401, 403):
            raise SpecUIError(
                f"the server at {redact_url(self.base_url)} refused the request ({r.status_code}):"
                " check the API key"
            )
        if r.status_code != 200:
            raise SpecUIError(
                f"{redact_url(self.base_url)}/v1/models answered {r.status_code}; is this an"
                " OpenAI-compatible vLLM server?"
            )
        try:
            models = r.json()["data"]
            return str(models[0]["id"])
        except (ValueError, KeyError, IndexError, TypeError):
            raise SpecUIError(f"{redact_url(self.base_url)}/v1/models lists no model") from None

    def healthy(self) -> bool:
        try:
            with self.client(5.0) as c:
                return c.get("/health").status_code == 200
        except httpx.HTTPError:
            return False

    def status(self) -> dict[str, Any]:
        """What the dashboard shows: state, URL, model, pid, start-up time."""
        return {
            "state": str(self.state),
            "base_url": redact_url(self.base_url),
            "model": self.model,
            "owned": self.owned,
            "server_pid": self.server_pid if self.owned else None,
            "ready_after_s": self.ready_after_s,
            "speculative_config": self.plan.speculative_config if self.plan else None,
            "healthy": self.healthy()
            if self.state in (ServerState.RUNNING, ServerState.ATTACHED)
            else False,
        }


# Variables that must not leak from the app's environment into vLLM's: another
# interpreter's paths, and an API key the launched server would then demand.
_DROPPED_ENV = frozenset({"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "VLLM_API_KEY"})


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


@contextlib.contextmanager
def launched(cfg: ServerConfig) -> Iterator[VLLMServer]:
    """``with launched(cfg) as server:`` -- stopped on leaving the block."""
    server = VLLMServer.launch(cfg)
    try:
        yield server
    finally:
        server.stop()
