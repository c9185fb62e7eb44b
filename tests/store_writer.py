"""A run recorder in its own process, for the concurrency and SIGKILL tests.

usage: python -m tests.store_writer DB PROMPTS STEPS_PER_PROMPT BATCH [PAUSE_EVERY PAUSE_S]
Prints "RUN <id>" once the run exists."""

from __future__ import annotations

import sys
import time

from specui.store import DecodingSettings, RunRecorder, Store
from tests.store_helpers import make_result, make_trace


def main() -> None:
    db, n_prompts, n_steps, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    pause_every = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    pause_s = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    store = Store(db)
    run = store.create_run(verifier="v", prompt_set="ps", algorithm="dflash", drafter="writer", settings=DecodingSettings(num_speculative_tokens=4))
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
            rec.end_prompt(make_result(steps, 1.0, 4))


if __name__ == "__main__":
    main()
