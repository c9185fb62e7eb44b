"""A vLLM OpenAI-compatible server that SpecUI launches and owns, or one it attaches to.

Launching::

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
import ipaddress
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from specui.algorithms.ngram import DEFAULT_NGRAM, NgramConfig
from specui.algorithms.spec import ALGORITHMS, algorithm_for_vllm, algorithm_specs
from specui.errors import SpecUIError
from specui.paths import REPO_ROOT, data_dir
from specui.vllm.draft_head import servable_folder
from specui.vllm.install import (
    check_installed,
    is_cpu_build,
    vllm_python,
    with_adaptive_verification,
)
from specui.vllm.watchdog import group_alive

log = logging.getLogger(__name__)

# vLLM-CPU reserves memory for the KV cache from a fraction of RAM by default
# (92%); SmolLM2-sized models need far less.  An explicit size also lets vLLM
# skip its warm-up pass in eager mode, which shortens start-up.
CPU_KV_CACHE_BYTES = 1 << 30


def cpu_speculators() -> list[str]:
    """The algorithms vLLM-CPU can serve (AlgorithmSpec.vllm_cpu; DSpark needs vLLM's GPU model
    runner)."""
    return [spec.name for spec in algorithm_specs() if spec.vllm_method and spec.vllm_cpu]


def check_cpu_serves(speculative_config: dict[str, Any] | None) -> None:
    """Refuse, before a launch, an algorithm vLLM's CPU build cannot serve."""
    name = algorithm_for_vllm(speculative_config)
    spec = ALGORITHMS.get(name) if name else None
    if spec is not None and not spec.vllm_cpu:
        raise SpecUIError(
            spec.vllm_cpu_refusal
            or f"{spec.label} drafters do not run on vLLM's CPU build (vllm-cpu)"
        )


class ServerState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"  # stopped by us
    EXITED = "exited"  # died on its own
    ATTACHED = "attached"  # someone else's server


# --- configuration ---------------------------------------------------------------------


def resolve_model(verifier: str) -> str:
    """``embedded`` -> the converted SmolLM2 folder; a path -> its absolute form; else a hub id."""
    if verifier == "embedded":
        from specui.verifier.embedded import embedded_folder

        return str(embedded_folder())
    path = Path(verifier).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise SpecUIError(
                f"verifier folder {path} has no config.json (vLLM serves Hugging Face folders)"
            )
        check_safetensors(path, "verifier")
        return str(path.resolve())
    if verifier.startswith((".", "/", "~")):
        raise SpecUIError(f"verifier path does not exist: {verifier}")
    return verifier


def check_safetensors(folder: Path, what: str) -> None:
    """vLLM falls back to ``*.bin`` / ``*.pt`` weights (pickle: loading them can run
    code) when a folder has no safetensors; SpecUI hands it safetensors folders only."""
    if not any(folder.glob("*.safetensors")):
        pickled = sorted(
            p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".pkl", ".ckpt")
        )
        found = f" (only pickle weights: {', '.join(pickled)})" if pickled else ""
        raise SpecUIError(
            f"{what} folder {folder} has no .safetensors weights{found}; SpecUI never loads pickle"
            " files"
        )


def speculator_method(speculative_config: dict[str, Any] | None) -> str | None:
    return None if not speculative_config else str(speculative_config.get("method") or "")


def speculator_algorithm(speculator: str | None) -> str:
    """The algorithm name a run stores: the folder's speculators_model_type, ``ngram`` or
    ``none``."""
    if not speculator or speculator in ("none", "plain"):
        return "none"
    if speculator in ("ngram", "suffix"):
        return speculator
    refuse_hybrid(speculator)
    try:
        cfg = json.loads((Path(speculator).expanduser() / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise SpecUIError(f"speculator {speculator}: cannot read config.json ({e})") from None
    return str(cfg.get("speculators_model_type") or "unknown")


def refuse_hybrid(speculator: str) -> None:
    """A ``LEARNED+LOOKUP`` hybrid is SpecUI's own proposer: vLLM runs one method at a time."""
    learned, plus, lookup = speculator.rpartition("+")
    if plus and lookup in ("ngram", "suffix") and not Path(speculator).expanduser().exists():
        raise SpecUIError(
            f"{speculator!r} is a hybrid proposer (a learned drafter and {lookup} lookup in one),"
            " which vLLM has no method for: vLLM runs one speculative method at a time. Run"
            f" {learned!r} or {lookup!r} on vLLM, or the hybrid on the local engine"
        )


def build_speculative_config(
    speculator: str | None, num_speculative_tokens: int | None, ngram: NgramConfig = DEFAULT_NGRAM
) -> dict[str, Any] | None:
    """vLLM's ``--speculative-config`` for a speculators folder, ``ngram`` or nothing."""
    if not speculator or speculator in ("none", "plain"):
        return None
    if speculator == "ngram":
        k = num_speculative_tokens or 4
        # Prompt lookup with the sizes the local NgramDrafter uses (one NgramConfig for both).
        return {"method": "ngram", "num_speculative_tokens": k, **ngram.vllm_settings()}
    if speculator == "suffix":
        from specui.algorithms.suffix import SuffixConfig

        # vLLM's own method and names; its K defaults to the tree depth, as the local drafter's.
        cfg = SuffixConfig()
        k = num_speculative_tokens or cfg.suffix_decoding_max_tree_depth
        return {"method": "suffix", "num_speculative_tokens": k, **cfg.settings()}
    refuse_hybrid(speculator)
    folder = Path(speculator).expanduser()
    if not (folder / "config.json").is_file():
        raise SpecUIError(
            f"speculator {speculator!r} is neither none, ngram nor a folder with config.json"
        )
    check_safetensors(folder, "speculator")
    from specui.export import speculative_config

    return speculative_config(folder, num_speculative_tokens)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the server binds it a few seconds later;
    a collision shows up as a clear start-up error)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _cpu_bind(tensor_parallel_size: int, threads: int | None = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND: ``threads`` of this process's allowed cores
    split over the tensor-parallel ranks ("0", or "0,1|2,3").

    Default: every core but one.  vLLM's OpenMP threads spin-wait for each
    other, and its API-server and engine-core processes (and the app, and the
    benchmark client) need a core too: measured on a 2-core machine with
    SmolLM2, binding both cores gave 5-6 tok/s at batch 1 and 33-37 tok/s with
    8 requests in flight, one core 16-17 and 87-90 tok/s."""
    cores = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )
    if threads is None:
        threads = max(tensor_parallel_size, len(cores) - 1)
    if threads < 1:
        raise SpecUIError(f"CPU threads must be >= 1, got {threads}")
    cores = cores[:threads]
    n = max(1, tensor_parallel_size)
    if len(cores) < n:
        raise SpecUIError(
            f"tensor parallel size {n} needs at least {n} CPU cores; {len(cores)} are available"
        )
    per = len(cores) // n
    return "|".join(",".join(map(str, cores[r * per : (r + 1) * per])) for r in range(n))


@dataclass
class ServerConfig:
    """What to serve and how.  ``None`` fields take the default of the build
    (CPU: float32, eager, a 1 GiB KV cache; GPU: vLLM's own defaults)."""

    verifier: str = "embedded"  # embedded | a Hugging Face folder | a hub id (GPU machines)
    speculator: str | None = None  # a speculators folder | ngram | None
    num_speculative_tokens: int | None = None  # K; None = the checkpoint's
    ngram: NgramConfig = DEFAULT_NGRAM  # the lookup sizes when speculator is ngram
    speculative_config: dict[str, Any] | None = (
        None  # overrides speculator/K (e.g. extract_hidden_states)
    )
    kv_transfer_config: dict[str, Any] | None = None
    host: str = "127.0.0.1"
    port: int | None = None  # None = a free port
    python: str | None = None  # vLLM's interpreter (see vllm_python)
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    kv_cache_bytes: int | None = None
    dtype: str | None = None
    enforce_eager: bool | None = None
    max_model_len: int | None = None
    served_model_name: str | None = None
    # Per-request acceptance in each response (needs a speculator): "detailed"
    # gives the ordered per-step accepted/drafted counts SpecUI stores as steps.
    spec_decode_metrics: str = "detailed"
    # vLLM's adaptive verification (newer builds; refused with the reason where absent).
    # Ignored for a run without a speculator (a bench's baseline): nothing to verify.
    adaptive_verification: bool = False
    enable_prefix_caching: bool | None = None
    cpu_threads: int | None = (
        None  # CPU builds: cores for vLLM's OpenMP threads (None: all but one)
    )
    access_log: bool = False  # uvicorn's line per request (health polls!) drowns the log tail
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 600.0
    stop_grace_s: float = 20.0
    log_path: str | None = None
    allow_remote_bind: bool = False  # the operator asked to listen beyond loopback


@dataclass
class LaunchPlan:
    """The exact command and environment a launch runs (shown to the user)."""

    argv: list[str]
    env: dict[str, str]  # only the variables SpecUI sets
    model: str
    speculative_config: dict[str, Any] | None
    cpu: bool
    host: str
    port: int

    @property
    def command_line(self) -> str:
        """The command as a shell line, secrets masked (it is shown and stored with runs)."""
        env = " ".join(
            f"{k}={'***' if _secret_name(k) else shlex.quote(v)}"
            for k, v in sorted(self.env.items())
        )
        argv = list(self.argv)
        for i, arg in enumerate(argv):
            if arg == "--api-key" and i + 1 < len(argv):
                argv[i + 1] = "***"
            elif arg.startswith("--api-key="):
                argv[i] = "--api-key=***"
        cmd = shlex.join(argv)
        return f"{env} {cmd}" if env else cmd

    @property
    def api_key(self) -> str | None:
        """An API key the operator passed in the extra arguments (our client must send it too)."""
        for i, arg in enumerate(self.argv):
            if arg == "--api-key" and i + 1 < len(self.argv):
                return self.argv[i + 1]
            if arg.startswith("--api-key="):
                return arg.split("=", 1)[1]
        return self.env.get("VLLM_API_KEY")


def _secret_name(name: str) -> bool:
    return any(word in name.upper() for word in ("KEY", "TOKEN", "SECRET", "PASSWORD"))


def _split_api_key(args: list[str]) -> tuple[list[str], str | None]:
    """``args`` without ``--api-key KEY`` / ``--api-key=KEY``, and the key."""
    out: list[str] = []
    key = None
    it = iter(args)
    for arg in it:
        if arg == "--api-key":
            key = next(it, None)
        elif arg.startswith("--api-key="):
            key = arg.split("=", 1)[1]
        else:
            out.append(arg)
    return out, key


def plan_launch(cfg: ServerConfig) -> LaunchPlan:
    """Turn a ServerConfig into the command line, refusing what cannot work."""
    if not _is_loopback(cfg.host) and not cfg.allow_remote_bind:
        raise SpecUIError(
            f"refusing to bind the vLLM server to {cfg.host}: it has no authentication by default. "
            "Bind to 127.0.0.1, or let the operator allow it explicitly (--allow-remote)"
        )
    if cfg.tensor_parallel_size < 1:
        raise SpecUIError(f"tensor parallel size must be >= 1, got {cfg.tensor_parallel_size}")
    if cfg.num_speculative_tokens is not None and not 1 <= cfg.num_speculative_tokens <= 64:
        raise SpecUIError(
            f"number of speculative tokens must be in 1..64, got {cfg.num_speculative_tokens}"
        )
    python = vllm_python(cfg.python)
    cpu = is_cpu_build(python)
    model = resolve_model(cfg.verifier)
    spec = cfg.speculative_config or build_speculative_config(
        cfg.speculator, cfg.num_speculative_tokens, cfg.ngram
    )
    if spec and spec.get("model"):
        spec = {**spec, "model": str(servable_folder(Path(spec["model"]), model))}
    if spec and cfg.adaptive_verification:
        spec = with_adaptive_verification(spec, python)
    method = speculator_method(spec)
    if cpu:
        check_cpu_serves(spec)
    port = cfg.port or free_port(cfg.host)
    argv = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--host",
        cfg.host,
        "--port",
        str(port),
    ]
    if cfg.served_model_name:
        argv += ["--served-model-name", cfg.served_model_name]
    if cfg.tensor_parallel_size > 1:
        argv += ["--tensor-parallel-size", str(cfg.tensor_parallel_size)]
    dtype = cfg.dtype or ("float32" if cpu else None)  # bf16 is slow on CPUs without AVX-512
    if dtype:
        argv += ["--dtype", dtype]
    if (
        cfg.enforce_eager if cfg.enforce_eager is not None else cpu
    ):  # compiling takes minutes on CPU
        argv.append("--enforce-eager")
    if cfg.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    kv_bytes = cfg.kv_cache_bytes or (
        CPU_KV_CACHE_BYTES if cpu and cfg.gpu_memory_utilization is None else None
    )
    if kv_bytes:
        argv += ["--kv-cache-memory-bytes", str(int(kv_bytes))]
    if cfg.max_model_len:
        argv += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.enable_prefix_caching is not None:
        argv.append(
            "--enable-prefix-caching" if cfg.enable_prefix_caching else "--no-enable-prefix-caching"
        )
    if spec:
        argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
        if cfg.spec_decode_metrics != "none" and method != "extract_hidden_states":
            argv += ["--per-request-spec-decode-metrics", cfg.spec_decode_metrics]
    if cfg.kv_transfer_config:
        argv += ["--kv-transfer-config", json.dumps(cfg.kv_transfer_config, separators=(",", ":"))]
    if not cfg.access_log:
        argv.append("--disable-uvicorn-access-log")
    extra, api_key = _split_api_key(cfg.extra_args)
    argv += extra
    env: dict[str, str] = {"VLLM_NO_USAGE_STATS": "1"}  # no phoning home from a test or a laptop
    if api_key:
        # vLLM reads VLLM_API_KEY too: an environment is private to the user, a command
        # line is not (ps shows it to everyone on the machine).
        env["VLLM_API_KEY"] = api_key
    if cpu:
        # An explicit binding (see _cpu_bind) instead of vLLM's auto binding,
        # which picks one logical CPU per physical core by topology.
        env["VLLM_CPU_OMP_THREADS_BIND"] = _cpu_bind(cfg.tensor_parallel_size, cfg.cpu_threads)
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    if Path(model).is_dir():
        env["HF_HUB_OFFLINE"] = "1"  # everything is local: no hub look-ups stalling start-up
    env.update(cfg.env)
    return LaunchPlan(
        argv=argv, env=env, model=model, speculative_config=spec, cpu=cpu, host=cfg.host, port=port
    )


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


def parse_extra_args(text: str | Sequence[str] | None) -> list[str]:
    """Extra vLLM arguments typed as one shell-quoted string."""
    if not text:
        return []
    if isinstance(text, str):
        try:
            return shlex.split(text)
        except ValueError as e:
            raise SpecUIError(f"cannot parse the extra vLLM arguments: {e}") from None
    return list(text)
