"""The drafters' training campaign (issue 49), resumable: run it again and it goes on.

    python scripts/campaign.py run       # every stage that is not done, in order
    python scripts/campaign.py status    # where it stands
    python scripts/campaign.py commit    # once generation is done: prompts and responses into
                                         # data/corpus (xz), to commit; a bare machine restarts
                                         # from them
    bash scripts/campaign.sh             # the same `run`, in the background, at low priority

Stages: prompts, generate (in shards), materialize, then the training stages of
specui/training/campaign_train.py (extract, lr-check, dflash, dspark, peagle, eagle3).
State lives in one folder outside the repository (SPECUI_CAMPAIGN_DIR, default
~/specui-campaign); see specui/training/campaign.py.  One torch thread unless THREADS says
otherwise.  The prompts stage needs Debian's text packages (scripts/campaign.sh installs them).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _verifier():
    import torch

    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    from specui.verifier.model import Verifier

    # float32 as loaded: the response cache is keyed by the verifier training loads.
    return Verifier.load("embedded")


def run(folder: Path, shard: tuple[int, int]) -> None:
    import torch
    from tqdm import tqdm

    from specui.training import campaign

    verifier = _verifier()
    with campaign.campaign_lock(folder, shard):
        logging.info("campaign: state in %s, shard %d of %d", folder, shard[0], shard[1])
        if shard[0] == 0:
            campaign.build_all_prompts(verifier, folder)
        else:  # shard 0 writes the prompts; the others wait for them
            while not all(p.is_file() for p in campaign.part_paths(folder)):
                time.sleep(30)
        before = campaign.status(verifier, folder)
        logging.info(
            "generate: %d of %d prompts answered, %d response tokens",
            before.done,
            before.total,
            before.response_tokens,
        )
        bar = tqdm(
            total=before.total,
            initial=before.done,
            desc="generate",
            unit="prompt",
            mininterval=30,
            dynamic_ncols=True,
        )
        t_start, totals = time.time(), {"answered": 0, "tokens": 0}

        def on_chunk(i: int, n: int, answered: int, tokens: int, seconds: float) -> None:
            # Counted from what each chunk returned: re-reading the cache and re-encoding every
            # prompt after each chunk (campaign.status) cost a core for tens of seconds.
            totals["answered"] += answered
            totals["tokens"] += tokens
            bar.n = max(bar.n, totals["answered"])
            bar.refresh()
            logging.info(
                "generate: chunk %d/%d in %.0f s; chunks so far hold %d answered prompts, %d"
                " response tokens; %.0f s this run",
                i + 1,
                n,
                seconds,
                totals["answered"],
                totals["tokens"],
                time.time() - t_start,
            )

        # bf16 matmuls generate; the cache stays keyed by the float32 verifier (self_distill).
        campaign.generate(
            verifier, folder, torch.bfloat16, on_chunk, shard=shard if shard[1] > 1 else None
        )
        bar.close()
        logging.info("generate: done")
        if shard[0] == 0:  # the other shards stop here; shard 0 goes on once all are done
            _after_generation(verifier, folder, shard[1])


def _after_generation(verifier, folder: Path, shards: int) -> None:
    from specui.training import campaign

    # Another shard may still answer its last prompts: wait until its lock is free (a cheap
    # check; the status below re-reads every response and prompt once).
    while any(campaign.shard_running(folder, i) for i in range(1, shards)):
        logging.info("generate: waiting for the other shards to finish")
        time.sleep(60)
    done = campaign.status(verifier, folder)
    if done.done < done.total:
        logging.info(
            "generate: %d prompts still without a response and no other shard at work; run again",
            done.total - done.done,
        )
        return
    from specui.training import campaign_train

    if not (folder / campaign.TRAIN_FILE).is_file():
        m = campaign.materialize(verifier, folder)
        logging.info(
            "materialize: %s, %d rows (%d of the general corpus), %d missing",
            m.path,
            m.rows,
            m.general,
            m.missing,
        )
    # One training process a core (torchrun, DDP) unless WORLD says otherwise.
    campaign_train.run(folder, world=int(os.environ.get("WORLD", "2")))


def status(folder: Path) -> None:
    from specui.training import campaign

    if not (folder / "prompts.jsonl").is_file():
        print(f"{folder}: no prompts yet (run: bash scripts/campaign.sh)")
        return
    p = campaign.status(_verifier(), folder)
    print(f"{folder}: generate {p.done}/{p.total} prompts, {p.response_tokens} response tokens")


def commit(folder: Path) -> None:
    from specui.training import campaign

    for path in campaign.commit_corpus(_verifier(), folder):
        print(f"{path.relative_to(REPO)}: {path.stat().st_size / 1e6:.1f} MB")


def main() -> None:
    from specui.training.campaign import state_dir

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("stage", choices=("run", "status", "commit"))
    ap.add_argument("--state", type=Path, default=None, help="the state folder")
    ap.add_argument(
        "--shard",
        default="0/1",
        help="I/N: this process generates the prompts whose key falls to shard I of N (one"
        " process a core)",
    )
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    folder = a.state or state_dir()
    if a.stage in ("status", "commit"):
        {"status": status, "commit": commit}[a.stage](folder)
        return
    index, count = (int(x) for x in a.shard.split("/"))
    if not 0 <= index < count:
        ap.error(f"--shard {a.shard}: want I/N with 0 <= I < N")
    run(folder, (index, count))


if __name__ == "__main__":
    main()
