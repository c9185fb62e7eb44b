"""``specui jobs``: list, show and cancel background jobs; start a worker runner."""

from __future__ import annotations

import argparse
import time

from specui.commands import add_id_command, add_worker_arguments, local_time, text_table
from specui.commands.runs import add_db_option
from specui.jobs import queue
from specui.store import JobStatus, Store


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("jobs", help="list, show and cancel background jobs")
    add_db_option(p)
    common = argparse.ArgumentParser(add_help=False)
    add_db_option(common, on_subcommand=True)
    js = p.add_subparsers(dest="jobs_command", required=True, metavar="{list,show,cancel,worker}")

    ls = js.add_parser("list", parents=[common], help="jobs, newest first")
    ls.add_argument("--status", choices=[s.value for s in JobStatus])
    ls.add_argument("--kind")
    ls.add_argument("--limit", type=int, default=50)
    ls.set_defaults(func=cmd_list)

    show_help = "one job: parameters, log tail, latest metrics"
    add_id_command(js, common, "show", show_help, "job_id", cmd_show)
    cancel_help = "cancel a queued or running job"
    add_id_command(js, common, "cancel", cancel_help, "job_id", cmd_cancel, force="cancel a job")

    wk = js.add_parser("worker", parents=[common], help="run queued jobs (each in its own process)")
    wk.add_argument("--max-jobs", type=int, help="jobs at once (default: $SPECUI_MAX_JOBS or 1)")
    add_worker_arguments(wk)
    wk.set_defaults(func=cmd_worker)


def cmd_list(args: argparse.Namespace) -> int:
    with Store(args.db) as store:
        jobs = queue.list_jobs(store, status=args.status, kind=args.kind, limit=args.limit)
    if not jobs:
        print("no jobs")
        return 0
    rows = [
        [
            str(j.id),
            j.kind,
            str(j.status)
            + (" (cancelling)" if j.cancel_requested_at and j.status == JobStatus.RUNNING else ""),
            f"{100 * j.progress:.0f}%",
            local_time(j.created_at),
            (j.error or j.message or "")[:60],
        ]
        for j in jobs
    ]
    print(text_table(["ID", "KIND", "STATUS", "PROGRESS", "CREATED", "MESSAGE"], rows))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with Store(args.db) as store:
        job = store.get_job(args.job_id)
        metrics = store.job_metrics(args.job_id)
    print(f"job {job.id}: {job.kind}  [{job.status}]  {100 * job.progress:.0f}%")
    print(f"  params   {job.params_json}")
    for key, value in (
        ("created", local_time(job.created_at)),
        ("started", local_time(job.started_at)),
        ("ended", local_time(job.ended_at)),
        ("message", job.message),
        ("error", job.error),
        ("result", job.result_json),
    ):
        if value not in (None, "-"):
            print(f"  {key:<8} {value}")
    latest: dict[str, tuple[int, float]] = {}
    for m in metrics:
        latest[m.name] = (m.step, m.value)
    for name, (step, value) in sorted(latest.items()):
        print(f"  metric   {name} = {value:.6g} (step {step})")
    if job.log_tail:
        print("log tail:")
        print("\n".join("  " + ln for ln in job.log_tail.splitlines()[-20:]))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with Store(args.db) as store:
        job = queue.cancel(store, args.job_id, requester=None, force=args.force)
    if job.status == JobStatus.CANCELLED:
        print(f"job {job.id} cancelled")
    elif job.status == JobStatus.RUNNING:
        print(f"job {job.id}: cancel requested (its runner stops it)")
    else:
        print(f"job {job.id} already ended ({job.status}); nothing to cancel")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from specui.jobs import Runner

    runner = Runner(args.db, max_jobs=args.max_jobs, modules=tuple(args.modules))
    print(
        f"worker: {runner.store.path}, up to {runner.max_jobs} job(s), kinds:"
        f" {', '.join(runner.kinds)}",
        flush=True,
    )
    started = time.monotonic()
    try:
        runner.run(until_idle=args.until_idle)
    except KeyboardInterrupt:
        runner.stop(wait=False)
    print(f"worker: stopped after {time.monotonic() - started:.0f} s")
    return 0
