"""A run recorder in its own process, for the concurrency and SIGKILL tests.

usage: python -m tests.support.store_writer DB PROMPTS STEPS_PER_PROMPT BATCH [PAUSE_EVERY PAUSE_S
[GATE]]
Prints "RUN <id>" once the run exists.  With GATE (a file holding the reader's
read count), each pause also waits until the reader has read once more, so reads
and writes interleave however slow or busy the machine is."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from specui.store import DecodingSettings, RunRecorder, Store
from tests.support.store_helpers import make_result, make_trace


def main() -> None:
    db, n_prompts, n_steps, batch = (
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    pause_every = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    pause_s = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    gate = Path(sys.argv[7]) if len(sys.argv) > 7 else None
    store = Store(db)
    run = store.create_run(
        verifier="v",
        prompt_set="ps",
        algorithm="dflash",
        drafter="writer",
        settings=DecodingSettings(num_speculative_tokens=4),
    )
    print(f"RUN {run.id}", flush=True)
    with RunRecorder(store, run.id, batch_steps=batch, flush_interval_s=0.05) as rec:
        for p in range(n_prompts):
            rec.begin_prompt(p, f"prompt {p}")
            steps = []
            for i in range(n_steps):
                t = make_trace(i, seed=p)
                steps.append(t)
                rec.step(t)
                if pause_every and i % pause_every == pause_every - 1:
                    time.sleep(pause_s)
                    if gate is not None:
                        _wait_for_a_read(gate)
            rec.end_prompt(make_result(steps, 1.0, 4))


_last_read = -1


def _wait_for_a_read(gate: Path, timeout_s: float = 60.0) -> None:
    global _last_read
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            n = int(gate.read_text() or -1)
        except (FileNotFoundError, ValueError):
            n = -1
        if n > _last_read:
            _last_read = n
            return
        time.sleep(0.002)


if __name__ == "__main__":
    main()
