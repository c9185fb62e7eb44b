"""The worker process's entry point: ``python -m workers.runner`` runs queued jobs (a
supervisor, ``specui.jobs.Runner``), and ``--job ID`` runs one claimed job in this process
(what the supervisor starts for each job).  Everything else lives in ``specui.jobs``."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from specui.commands import add_worker_arguments
from specui.errors import SpecUIError
from specui.jobs import Runner, run_job
from specui.store import JobStatus, default_db_path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m workers.runner", description="Run queued SpecUI jobs in worker processes"
    )
    p.add_argument("--db", help="store file (default: $SPECUI_DATA_DIR/specui.db)")
    p.add_argument("--max-jobs", type=int, help="jobs run at once (default: $SPECUI_MAX_JOBS or 1)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between queue polls")
    p.add_argument(
        "--cancel-grace",
        type=float,
        default=10.0,
        help="seconds between a cancel request and SIGTERM",
    )
    add_worker_arguments(p)
    p.add_argument("--heartbeat", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument("--job", type=int, help=argparse.SUPPRESS)  # child mode: run this claimed job
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        if args.job is not None:
            status = run_job(
                args.db or str(default_db_path()),
                args.job,
                args.modules,
                heartbeat_s=args.heartbeat,
            )
            return 0 if status == JobStatus.DONE else 1
        runner = Runner(
            args.db,
            max_jobs=args.max_jobs,
            poll_s=args.poll,
            cancel_grace_s=args.cancel_grace,
            modules=tuple(args.modules),
            heartbeat_s=args.heartbeat,
        )
        # SIGTERM / Ctrl-C stop claiming; running jobs carry on in their own processes.
        signal.signal(signal.SIGTERM, lambda *_: runner.stop(wait=False))
        print(
            f"runner: {runner.store.path}, up to {runner.max_jobs} job(s), kinds:"
            f" {', '.join(runner.kinds)}",
            flush=True,
        )
        try:
            runner.run(until_idle=args.until_idle)
        except KeyboardInterrupt:
            runner.stop(wait=False)
        return 0
    except SpecUIError as e:
        print(f"runner: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
