"""Runs one command in a process group of its own and makes sure that group
dies with the process that started us.

Started by ``specui.vllm.server`` as ``python watchdog.py --pid-file F
--grace S -- CMD...`` with a pipe on stdin whose write end only the parent
holds.  When the parent exits -- cleanly, by an exception, or by SIGKILL,
which no atexit hook survives -- the kernel closes that write end, our stdin
reads EOF, and we stop the whole group: SIGTERM, then SIGKILL after the grace
period.  A process-group kill also reaches vLLM's EngineCore and worker
processes, which a signal to the API server alone may not.

Why a wrapper and not ``prctl(PR_SET_PDEATHSIG)`` in a preexec: the death
signal fires when the *thread* that forked exits, and the dashboard starts
servers from short-lived handler threads.  Standard library only: this runs
before and outside everything else.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies answer killpg(0) until reaped, and PID 1 in a container may never
    # reap the orphans: look at /proc for a live member.
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # fields: state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def stop_group(pgid: int, grace_s: float) -> None:
    """SIGTERM the group, SIGKILL whatever is left after ``grace_s``."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pid-file", required=True)
    p.add_argument("--grace", type=float, default=20.0)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        p.error("no command")
    parent = os.getppid()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())

    child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)
    tmp = args.pid_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(child.pid))
    os.replace(tmp, args.pid_file)

    def lifeline() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except OSError:
            pass
        stop.set()  # EOF: the parent is gone or asked us to stop

    threading.Thread(target=lifeline, daemon=True).start()
    # getppid() changing is a second witness of the parent's death (in case a
    # forked sibling inherited the pipe's write end and keeps it open).
    while child.poll() is None and not stop.is_set() and os.getppid() == parent:
        stop.wait(0.5)
    if child.poll() is None:
        print(
            f"specui watchdog: stopping the server (pid {child.pid})", file=sys.stderr, flush=True
        )
    stop_group(child.pid, args.grace)
    # Reap stragglers of a server that exited by itself (engine processes).
    if group_alive(child.pid):
        stop_group(child.pid, 2.0)
    try:
        code = child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        code = -9
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
