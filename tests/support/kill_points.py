"""Kill a write at every point it can be killed: ``kill -9`` before each file-system call.

usage: python -m tests.support.kill_points checkpoint ROOT VERIFIER
       python -m tests.support.kill_points state ROOT

One process imports torch and builds what the write needs once; then, for n = 1, 2, ...,
it prepares a trial folder ROOT/tNNN, forks, and the child does the write with an audit
hook that sends itself SIGKILL at the n-th file-system call under that folder (open,
mkdir, chmod, rename/replace, remove, rmdir, rmtree: Python raises an audit event before
each).  It prints ``n killed`` per trial, ``n done`` when the write finished before call
n, and stops there.  The test then checks every trial folder as a restart would find it.

checkpoint: ROOT/template holds the checkpoints of steps 2 and 4 (keep 2); a trial saves
  step 6 (which removes step 2) and then saves step 6 again (a re-run of a saved step,
  which replaces it).
state: ROOT/template holds train_run.json and a metrics.jsonl with lines past step 4 and
  a torn last line; a trial rewrites train_run.json and trims the metrics at step 4.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

AUX = [1, 3, 4]  # the fixture verifier's aux layers
MASK = 511
_FS_EVENTS = {"open", "os.mkdir", "os.chmod", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree"}

NEW_RUN = {"config": {"algorithm": "dflash", "steps": 6}, "status": "finished", "step": 6}
OLD_RUN = {"config": {"algorithm": "dflash", "steps": 6}, "status": "running"}
METRICS = "".join(f'{{"step": {s}, "loss": {1.0 / s}}}\n' for s in (2, 4, 6)) + '{"step": 8, "lo'


def _kill_at(n: int, trial: Path) -> None:
    prefix, count = str(trial), 0

    def hook(event: str, args: tuple) -> None:
        nonlocal count
        if event not in _FS_EVENTS:
            return
        path = args[0]
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if isinstance(path, bytes):
            path = path.decode()
        if not isinstance(path, str):  # open(fd): the file was opened (and counted) already
            return
        if os.path.isabs(path) and not path.startswith(prefix):
            return  # imports, caches: not this write (rmtree's relative names are)
        count += 1
        if count == n:
            os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)


def run_trials(root: Path, write: Callable[[Path], None]) -> None:
    for n in itertools.count(1):
        trial = root / f"t{n:03d}"
        shutil.copytree(root / "template", trial)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _kill_at(n, trial)
                write(trial)
            except BaseException:  # noqa: BLE001 - a failed write is the test's failure
                import traceback

                traceback.print_exc()
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            print(f"{n} killed", flush=True)
        elif os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            print(f"{n} done", flush=True)
            return
        else:
            sys.exit(f"trial {n}: the write failed (status {status})")
        if n > 500:
            sys.exit("more than 500 kill points: the hook counts something it should not")


def checkpoint_trials(root: Path, verifier_path: str) -> None:
    import torch

    from specui.algorithms import create_drafter
    from specui.training.config import TrainConfig
    from specui.training.state import save_checkpoint
    from specui.training.step import make_optimizer
    from specui.verifier.model import Verifier

    torch.set_num_threads(1)  # no OpenMP pool: forking stays safe
    verifier = Verifier.load(verifier_path)
    model = create_drafter(
        "dflash", verifier, num_layers=1, aux_layer_ids=AUX, mask_token_id=MASK, seed=0
    ).model
    opt = make_optimizer(
        [p for p in model.parameters() if p.requires_grad], TrainConfig(algorithm="dflash")
    )
    sum((p.float() ** 2).sum() for p in model.parameters() if p.requires_grad).backward()
    opt.step()  # moments: optimizer.pt at its full size
    state = {"algorithm": "dflash"}
    for step in (2, 4):
        save_checkpoint(root / "template", step, model, opt, state, keep=2)

    def write(trial: Path) -> None:
        save_checkpoint(trial, 6, model, opt, state, keep=2)
        save_checkpoint(trial, 6, model, opt, state, keep=2)

    run_trials(root, write)


def state_trials(root: Path) -> None:
    from specui.atomic import write_json
    from specui.training.checkpoint import RUN_FILE
    from specui.training.evaluation import METRICS_FILE, trim_metrics

    template = root / "template"
    template.mkdir(parents=True)
    write_json(template / RUN_FILE, OLD_RUN)
    (template / METRICS_FILE).write_text(METRICS)

    def write(trial: Path) -> None:
        write_json(trial / RUN_FILE, NEW_RUN)
        trim_metrics(trial / METRICS_FILE, 4)

    run_trials(root, write)


if __name__ == "__main__":
    what, where = sys.argv[1], Path(sys.argv[2])
    if what == "checkpoint":
        checkpoint_trials(where, sys.argv[3])
    else:
        state_trials(where)
