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

from tests.conftest import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_app(data_dir: Path, timeout_s: float = 180.0):
    port = free_port()
    env = {**os.environ, "SPECUI_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    log = open(data_dir / "app.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port)], cwd=REPO, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"app exited with {proc.returncode}: {(data_dir / 'app.log').read_text()[-3000:]}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("app did not start in time")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
