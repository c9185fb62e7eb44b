"""Start ``python app.py`` on a free loopback port for UI tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.paths import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_app(argv: list[str], env: dict[str, str], log) -> subprocess.Popen:
    """``argv`` (an app.py command line) started from the repository root in a session of its
    own, stdout and stderr to the open file ``log``."""
    return subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


# Chromium's flags for the browser tests: headless in a container, nothing fetched in the
# background.
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def launch_chromium(playwright, exe: str):
    """The Chromium at ``exe`` launched through ``playwright`` with ``CHROMIUM_ARGS``."""
    return playwright.chromium.launch(executable_path=exe, args=[*CHROMIUM_ARGS])


def wait_until_serving(proc: subprocess.Popen, url: str, deadline: float, log_tail) -> None:
    """Poll ``url`` until it answers 200; a process that exits, or the deadline, is an error
    that shows ``log_tail()`` (the app's log)."""
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the app exited with {proc.returncode}:\n{log_tail()}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the app did not serve {url} in time:\n{log_tail()}")
        time.sleep(0.5)


@contextmanager
def running_app(data_dir: Path, timeout_s: float = 180.0, env: dict[str, str] | None = None):
    """``app.py`` serving ``data_dir`` (``env``: more environment variables) until the block
    ends; yields its URL."""
    port = free_port()
    env = {
        **os.environ,
        "SPECUI_DATA_DIR": str(data_dir),
        "PYTHONUNBUFFERED": "1",
        "GRADIO_ANALYTICS_ENABLED": "False",
        **(env or {}),
    }
    log = open(data_dir / "app.log", "wb")  # noqa: SIM115 - closed below
    proc = launch_app([sys.executable, "app.py", "--port", str(port)], env, log)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until_serving(
            proc,
            url,
            time.monotonic() + timeout_s,
            lambda: (data_dir / "app.log").read_text()[-3000:],
        )
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
