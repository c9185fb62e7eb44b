"""Memory of a loaded verifier in each precision (run by hand, not in CI).

    .venv/bin/python bench/verifier_memory.py [--verifier embedded]
        [--drafters dflash,dspark,eagle3,peagle]

Each precision loads in a fresh process, so one load's freed memory cannot hide
another's.  Reported per precision, after the load (and ``check()`` for bf16) and
a ``malloc_trim``:

* ``anon``: anonymous resident memory (``RssAnon``), what the process really
  holds.  Float32 weights read from the converted safetensors cache stay
  file-backed pages (``RssFile``: page cache the kernel can drop and re-read),
  so they do not count here; copies made from them do;
* ``+drafters``: the same after resolving the listed shipped drafters beside it,
  as the Playground's workbench does (beside a bf16 verifier they draft in bf16).

Ratios are against float32 in the same run.

Measured 2026-11-30 (SmolLM2-135M, the four shipped drafters, one thread):

    precision     anon MiB   +drafters MiB   anon / fp32
    fp32               292             738          1.00
    bf16               558            1085          1.91

(bf16 before its layers dropped their float32 weights: 814 MiB.)  bf16 holds more than
float32 because float32 reads its weights straight from the mapped file, while bf16
makes packed copies (2 bytes a weight) and keeps the float32 embedding and head that
drafters borrow.  The drafters add 0.45 GiB in float32 and 0.51 GiB beside bf16: they keep
their float32 weights next to the bf16 copies they draft with (left so: a drafter may read
a weight directly, as DFlash's head does).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CHILD = r"""
import ctypes, gc, json, sys
import torch
torch.set_num_threads(1)
from specui.algorithms.resolve import resolve_drafter
from specui.verifier.model import Verifier

def anon_mib():
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no RssAnon in /proc/self/status")

verifier_choice, precision = sys.argv[1], sys.argv[2]
drafters = [d for d in sys.argv[3].split(",") if d]
v = Verifier.load(verifier_choice, precision=precision)
loaded = anon_mib()
kept = [resolve_drafter(d, v) for d in drafters]
print(json.dumps({"precision": v.precision, "anon": loaded, "with_drafters": anon_mib()}))
"""


def measure(verifier: str, precision: str, drafters: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, verifier, precision, drafters],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verifier", default="embedded")
    ap.add_argument(
        "--drafters",
        default="dflash,dspark,eagle3,peagle",
        help="shipped names or folders, comma-separated",
    )
    a = ap.parse_args()
    rows = [measure(a.verifier, p, a.drafters) for p in ("fp32", "bf16")]
    base = rows[0]["anon"]
    print(f"{'precision':<12}{'anon MiB':>10}{'+drafters MiB':>16}{'anon / fp32':>13}")
    for r in rows:
        print(
            f"{r['precision']:<12}{r['anon']:>10.0f}{r['with_drafters']:>16.0f}"
            f"{r['anon'] / base:>13.2f}"
        )


if __name__ == "__main__":
    main()
