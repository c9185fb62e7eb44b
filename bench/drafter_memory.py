"""What each shipped drafter costs in memory beside the app's verifier, by hand (issue 50):

    .venv/bin/python bench/drafter_memory.py [--precision auto]

For each shipped drafter, loaded as the app loads it (``resolve_drafter``: the kernels' copies,
then the float32 copies of the load let go, ``specui.algorithms.serving``) and, for comparison,
with every copy kept (``load_drafter`` + ``matmuls_in_bf16``, what a load held before):

- held: the bytes of every tensor the drafter keeps (``workbench.held_bytes``, what the drafter
  pool counts), with every copy and as served;
- load peak: the process's peak resident memory during the load above what it held before
  (``VmHWM``, reset before each load), and the resident memory the load leaves once the freed
  temporaries are handed back (``malloc_trim``, as the app's pool does after a load);
- the admission estimate of the same load (``serving.load_weights``): resident and peak.

One process, the loads in turn (a first load, thrown away, pays the one-time costs: the kernels'
build, the libraries' first use).
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specui.algorithms.checkpoint import load_drafter  # noqa: E402
from specui.algorithms.resolve import resolve_drafter, shipped_drafters  # noqa: E402
from specui.algorithms.serving import load_weights  # noqa: E402
from specui.processes import trim_malloc  # noqa: E402
from specui.verifier.model import Verifier  # noqa: E402
from specui.workbench import held_bytes  # noqa: E402

MIB = 2**20


def _status_mib(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    return float("nan")


def _settled_mib() -> float:
    gc.collect()
    trim_malloc()
    return _status_mib("VmRSS")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", default="auto", help="the verifier's (the app's: auto)")
    args = ap.parse_args()
    v = Verifier.load("embedded", precision=args.precision)
    print(f"verifier: embedded, {v.precision}")
    first = resolve_drafter(next(iter(shipped_drafters())), v)
    del first
    print(
        "drafter | held, every copy | held, served | load peak | resident after"
        " | estimate: resident | estimate: peak"
    )
    kept = []
    for name, path in shipped_drafters().items():
        every = load_drafter(path, v)
        if v.precision in ("bf16", "int8", "gguf", "gguf-q8"):
            every.matmuls_in_bf16(int8_rows=v.precision == "gguf-q8")
        every_mib = held_bytes(every, v) / MIB
        del every
        before = _settled_mib()
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the RSS now
        served = resolve_drafter(name, v)
        peak = _status_mib("VmHWM") - before
        after = _settled_mib() - before
        est = load_weights(path, v)
        print(
            f"{name} | {every_mib:.0f} MiB | {held_bytes(served, v) / MIB:.0f} MiB |"
            f" {peak:.0f} MiB | {after:.0f} MiB | {est.resident_bytes / MIB:.0f} MiB |"
            f" {est.peak_bytes / MIB:.0f} MiB",
            flush=True,
        )
        kept.append(served)  # loaded side by side, as the app's pool holds them
    return 0


if __name__ == "__main__":
    sys.exit(main())
