"""Security properties (issue 9): no pickle on a load path, visitors' paths confined to
the app's folders, capped uploads, loopback by default, one visitor cannot change
another's jobs, and no secret in logs, the database or CSV.

The app tests run the real ``python app.py`` (tests/support/app_server.py) and talk to it
with ``gradio_client`` and plain HTTP; the vLLM test starts a real server."""

from __future__ import annotations

import ast
import json
import os
import pickle
import socket
import sqlite3
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from specui.errors import SpecUIError
from tests.support.paths import REPO
from tests.support.vllm_skip import needs_vllm

# --- 1. no pickle on any load path --------------------------------------------------------

SCANNED = ["specui", "workers", "bench", "scripts", "app.py"]
PICKLE_MODULES = {
    "pickle",
    "cPickle",
    "_pickle",
    "dill",
    "joblib",
    "shelve",
    "cloudpickle",
    "marshal",
}


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def pickle_offenders(source: str, filename: str) -> list[str]:
    """Every construct in ``source`` that may unpickle (run code) when loading data."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            out += [
                f"{where} import {a.name}"
                for a in node.names
                if a.name.split(".")[0] in PICKLE_MODULES
            ]
        elif (
            isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PICKLE_MODULES
        ):
            out.append(f"{where} from {node.module} import ...")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name.endswith("torch.load") and not _is_true(_kw(node, "weights_only")):
                out.append(f"{where} {name}() without weights_only=True")
            if name in ("np.load", "numpy.load") and _is_true(_kw(node, "allow_pickle")):
                out.append(f"{where} {name}(allow_pickle=True)")
            if name.endswith("read_pickle") or name.endswith("to_pickle"):
                out.append(f"{where} {name}()")
            if _is_true(_kw(node, "trust_remote_code")):
                out.append(f"{where} {name}(trust_remote_code=True)")
    return out


def test_the_scanner_catches_each_construct() -> None:
    """The scan below can fail: each pattern it looks for is found in a sample."""
    sample = (
        "import pickle\nfrom dill import loads\nimport joblib\n"
        "torch.load(p)\ntorch.load(p, weights_only=False)\ntorch.load(p, weights_only=True)\n"
        "np.load(p, allow_pickle=True)\nnp.load(p)\npd.read_pickle(p)\n"
        "AutoModel.from_pretrained(p, trust_remote_code=True)\nAutoModel.from_pretrained(p)\n"
    )
    found = pickle_offenders(sample, "sample.py")
    assert [f.split(" ", 1)[0] for f in found] == [
        f"sample.py:{n}" for n in (1, 2, 3, 4, 5, 7, 9, 10)
    ], found


def test_no_pickle_on_any_load_path_in_the_source_tree() -> None:
    files = [REPO / "app.py"] + [p for d in SCANNED[:-1] for p in sorted((REPO / d).rglob("*.py"))]
    assert len(files) > 30  # the tree was found
    offenders = [
        o for f in files for o in pickle_offenders(f.read_text(), str(f.relative_to(REPO)))
    ]
    assert offenders == [], "pickle-capable loads:\n" + "\n".join(offenders)


class _WritesMarker:
    """Unpickling this opens (creates) ``path``: a stand-in for any code a pickle may run."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _evil_pickle(marker: Path) -> bytes:
    return pickle.dumps(_WritesMarker(marker))


def test_the_pickle_payload_really_runs_code(tmp_path) -> None:
    """The refusal tests below mean something: loading this payload does create its marker."""
    control = tmp_path / "control"
    pickle.loads(_evil_pickle(control)).close()
    assert control.exists()


@pytest.fixture
def data_dir(tmp_path, monkeypatch) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("SPECUI_DATA_DIR", str(data))
    monkeypatch.delenv("SPECUI_EXTRA_ROOTS", raising=False)
    monkeypatch.delenv("SPECUI_ADMIN", raising=False)
    return data


@pytest.mark.slow
def test_a_pickle_only_speculator_is_refused_on_every_load_path(
    data_dir, tmp_path, embedded_verifier
) -> None:
    from specui.algorithms import create_drafter
    from specui.algorithms.checkpoint import save_drafter, validate_checkpoint
    from specui.algorithms.resolve import resolve_drafter
    from specui.ui.speculators import import_folder
    from specui.vllm.launch_plan import build_speculative_config

    folder = save_drafter(
        create_drafter("dflash", embedded_verifier, seed=0, num_layers=1, mask_token_id=16),
        data_dir / "speculators" / "evil",
    )
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    (folder / "pytorch_model.bin").write_bytes(_evil_pickle(marker))

    with pytest.raises(SpecUIError, match="model.safetensors"):
        resolve_drafter(str(folder), embedded_verifier)
    assert any("model.safetensors" in p for p in validate_checkpoint(folder, embedded_verifier))
    with pytest.raises(SpecUIError, match="pickle weights .*pytorch_model.bin"):
        import_folder(str(folder), None, "imported")
    with pytest.raises(SpecUIError, match="pickle weights: pytorch_model.bin"):
        build_speculative_config(str(folder), None)  # what a vLLM launch would be handed
    assert not marker.exists()
    assert not (data_dir / "speculators" / "imported").exists()


def test_a_pickle_only_verifier_folder_is_refused(data_dir, tmp_path) -> None:
    from transformers import LlamaConfig

    from specui.verifier.model import Verifier
    from specui.vllm.launch_plan import resolve_model

    folder = data_dir / "verifier"
    sizes = dict(vocab_size=8, hidden_size=32, intermediate_size=64)
    heads = dict(num_attention_heads=4, num_key_value_heads=2)
    LlamaConfig(**sizes, num_hidden_layers=1, **heads).save_pretrained(folder)
    marker = tmp_path / "pwned"
    (folder / "pytorch_model.bin").write_bytes(_evil_pickle(marker))
    with pytest.raises(SpecUIError, match="cannot load verifier"):
        Verifier.load(str(folder))
    with pytest.raises(SpecUIError, match="pickle"):
        resolve_model(str(folder))
    assert not marker.exists()


# --- 2. paths from the UI stay in the app's folders ---------------------------------------


def _escapes(data: Path, outside: Path) -> list[str]:
    """``../``, an absolute path, a symlink pointing out, and ``~``: each names ``outside``."""
    (data / "speculators").mkdir(exist_ok=True)
    link = data / "speculators" / "link-out"
    if not link.is_symlink():
        link.symlink_to(outside)
    return [
        f"../{outside.name}",
        str(outside),
        "speculators/link-out",
        str(link),
        "~",
        "~/" + outside.name,
    ]


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder outside the data dir that looks like a speculator and a prompt file."""
    out = tmp_path / "secret"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"speculators_model_type": "dflash"}))
    (out / "model.safetensors").write_bytes(b"")
    (out / "prompts.jsonl").write_text('{"prompt": "secret"}\n')
    return out


def test_every_library_entry_point_of_the_ui_confines_paths(data_dir, outside) -> None:
    from specui.choices import ui_drafter, ui_prompts, ui_verifier
    from specui.store import Store
    from specui.ui.playground import run_playground
    from specui.ui.speculators import import_folder, validate
    from specui.ui.train import start_training
    from specui.vllm.client import BenchSettings
    from specui.vllm.launch_plan import ServerConfig
    from specui.vllm.session import VLLMSlot

    store = Store(data_dir / "specui.db")

    def play(verifier: str, drafters: list[str]) -> object:
        settings = (0, 0, 1, 0, 4, "hi", True, "off", 0.5, None, threading.Event())
        return next(run_playground(store, verifier, drafters, *settings))

    calls = {
        "speculators: import folder": lambda p: import_folder(p, None, "x"),
        "speculators: validate (verifier)": lambda p: validate(data_dir, p),
        "playground: verifier": lambda p: play(p, ["none"]),
        "playground: speculator": lambda p: play("embedded", [p]),
        "train: verifier": lambda p: start_training(
            store, "dflash", p, "demo", 1, 4, 4, 0, 1e-3, "t1", None
        ),
        "train: prompt file": lambda p: start_training(
            store, "dflash", "embedded", p, 1, 4, 4, 0, 1e-3, "t2", None
        ),
        "vllm: launch verifier": lambda p: VLLMSlot().launch(ServerConfig(verifier=p)),
        "vllm: launch speculator": lambda p: VLLMSlot().launch(ServerConfig(speculator=p)),
        "vllm: benchmark prompt file": lambda p: VLLMSlot().bench_current(
            store, prompts=p, limit=1, settings=BenchSettings(), verifier=None
        ),
        "vllm: compare speculator": lambda p: VLLMSlot().bench_compare(
            store,
            speculator=p,
            prompts="demo",
            limit=1,
            settings=BenchSettings(),
            cfg=ServerConfig(),
        ),
        "library: ui_drafter / ui_verifier / ui_prompts": lambda p: [
            f(p) for f in (ui_drafter, ui_verifier, ui_prompts)
        ],
    }
    for what, call in calls.items():
        for bad in [*_escapes(data_dir, outside), str(outside / "prompts.jsonl")]:
            with pytest.raises(SpecUIError, match="outside the folders this app may use"):
                call(bad)
                pytest.fail(f"{what} accepted {bad!r}")
    assert store.list_jobs() == []  # no training was queued
    assert not (data_dir / "speculators" / "x").exists()


def test_names_and_paths_inside_the_data_dir_still_work(data_dir, outside, monkeypatch) -> None:
    from specui.choices import ui_drafter, ui_prompts, ui_verifier
    from specui.ui.speculators import import_folder

    assert (
        ui_verifier("embedded") == "embedded"
        and ui_drafter("ngram") == "ngram"
        and ui_prompts("demo") == "demo"
    )
    assert ui_prompts("gsm-symbolic, rg-math") == "gsm-symbolic,rg-math"  # a mix of registered sets
    with pytest.raises(SpecUIError):  # a mix takes registered sets only: no path rides along
        ui_prompts(f"demo,{outside / 'prompts.jsonl'}")
    monkeypatch.setenv("SPECUI_ALLOW_HUB", "HuggingFaceTB/*")  # hub ids: the operator's choice
    assert (
        ui_verifier("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    inside = data_dir / "incoming" / "spec"
    inside.mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):
        (inside / f).write_bytes((outside / f).read_bytes())
    assert ui_drafter("incoming/spec") == str(inside.resolve()) == ui_drafter(str(inside))
    assert import_folder("incoming/spec", None, "mine") == data_dir / "speculators" / "mine"
    # The operator's override: more folders visitors may name.
    monkeypatch.setenv("SPECUI_EXTRA_ROOTS", str(outside))
    assert ui_prompts(str(outside / "prompts.jsonl")) == str((outside / "prompts.jsonl").resolve())


# --- the real app ---------------------------------------------------------------------------

TOKEN = "hf_" + uuid.uuid4().hex  # a fake Hugging Face token in the app's environment
UPLOAD_CAP_MB = 1


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from tests.support.app_server import running_app

    data = tmp_path_factory.mktemp("secapp")
    saved = {k: os.environ.get(k) for k in ("HF_TOKEN", "SPECUI_MAX_UPLOAD_MB", "SPECUI_ADMIN")}
    os.environ.update(HF_TOKEN=TOKEN, SPECUI_MAX_UPLOAD_MB=str(UPLOAD_CAP_MB))
    os.environ.pop("SPECUI_ADMIN", None)
    try:
        with running_app(data) as url:
            yield url, data
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _client(url: str):
    from gradio_client import Client

    return Client(url, verbose=False)


def test_the_app_listens_on_loopback_only(app) -> None:
    url, _ = app
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        # no packet sent: just picks this machine's outward address
        s.connect(("10.255.255.255", 1))
        lan = s.getsockname()[0]
    if lan.startswith("127."):
        pytest.skip("this machine has no non-loopback address")
    with pytest.raises(OSError), socket.create_connection((lan, port), timeout=3):
        pass
    socket.create_connection(("127.0.0.1", port), timeout=3).close()


def test_api_paths_outside_the_data_dir_are_refused(app, tmp_path) -> None:
    from gradio_client.exceptions import AppError

    url, data = app
    client = _client(url)
    for bad in ("/etc", "../../etc", "~"):
        with pytest.raises(AppError, match="outside the folders"):
            client.predict("hello", bad, "embedded", 0, 4, 0.0, 0, True, api_name="/decode")
        with pytest.raises(AppError, match="outside the folders"):
            client.predict("hello", "ngram", bad, 0, 4, 0.0, 0, True, api_name="/decode")
    secret = tmp_path / "p.jsonl"
    secret.write_text('{"prompt": "secret"}\n')
    status = client.predict(["ngram"], str(secret), 1, 4, 0.0, api_name="/bench_job")
    assert "outside the folders" in status
    leading = ["dflash", "embedded", str(secret), 1, 4, 4, 0, 1e-3, "evil", "local"]
    # The tab's generated settings follow (one per TrainConfig field): their defaults, or None.
    params = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/train"]
    rest = [
        q.get("parameter_default") if q.get("parameter_has_default") else None
        for q in params["parameters"][len(leading) :]
    ]
    status, _ = client.predict(*leading, *rest, api_name="/train")
    assert "outside the folders" in status


def test_oversized_and_wrong_type_uploads_are_refused(app, tmp_path) -> None:
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    url, data = app
    small = tmp_path / "config.json"
    small.write_text("{}")
    r = httpx.post(
        f"{url}gradio_api/upload", files={"files": ("config.json", small.read_bytes())}, timeout=30
    )
    assert r.status_code == 200, r.text  # the control: a small file goes through
    big = os.urandom((UPLOAD_CAP_MB + 1) * 2**20)
    r = httpx.post(
        f"{url}gradio_api/upload", files={"files": ("model.safetensors", big)}, timeout=60
    )
    assert r.status_code == 413, r.text
    evil = tmp_path / "pytorch_model.bin"
    evil.write_bytes(_evil_pickle(tmp_path / "pwned"))
    with pytest.raises(AppError, match="Invalid file type"):
        _client(url).predict("", [handle_file(str(evil))], "evil", api_name="/on_import")
    assert not (data / "speculators" / "evil").exists() and not (tmp_path / "pwned").exists()


def _wait_job(db: Path, job_id: int, statuses: tuple[str, ...], timeout_s: float = 120) -> str:
    from specui.store import Store

    store = Store(db)
    deadline = time.monotonic() + timeout_s
    while (status := str(store.get_job(job_id).status)) not in statuses:
        assert time.monotonic() < deadline, f"job {job_id} stuck in {status}"
        time.sleep(0.5)
    return status


def _job_choice(client, job_id: int) -> str:
    """Refresh this session's Job dropdown (its choices are per session) and return the
    entry of ``job_id``: the dropdown accepts only the choices it shows."""
    info = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    for name, spec in info.items():
        if spec["parameters"] or name == "/stop":
            continue
        out = client.predict(api_name=name)
        if isinstance(out, dict) and "choices" in out:
            return next(c[1] for c in out["choices"] if c[1].startswith(f"{job_id}:"))
    raise AssertionError("no endpoint refreshes the job list")


def test_one_session_cannot_cancel_or_resume_anothers_job(app) -> None:
    from specui.jobs import queue as jobs
    from specui.store import Store

    url, data = app
    alice, bob = _client(url), _client(url)
    store = Store(data / "specui.db")
    job = jobs.enqueue(store, "count", {"n": 100_000, "interval_s": 0.05}, owner=alice.session_hash)
    _wait_job(data / "specui.db", job.id, ("running",))
    assert "belongs to another session" in bob.predict(
        _job_choice(bob, job.id), api_name="/on_cancel"
    )
    assert (
        store.get_job(job.id).cancel_requested_at is None
        and str(store.get_job(job.id).status) == "running"
    )
    assert alice.predict(_job_choice(alice, job.id), api_name="/on_cancel") == "cancel requested"
    assert _wait_job(data / "specui.db", job.id, ("cancelled", "done", "failed")) == "cancelled"
    before = len(store.list_jobs())
    msg, _ = bob.predict(_job_choice(bob, job.id), api_name="/on_resume")
    assert "belongs to another session" in msg and len(store.list_jobs()) == before
    msg, _ = alice.predict(_job_choice(alice, job.id), api_name="/on_resume")
    assert msg.startswith("resuming as job"), msg
    resumed = int(msg.split("job ", 1)[1].split()[0])
    assert store.get_job(resumed).owner == alice.session_hash
    jobs.cancel(store, resumed, alice.session_hash)
    _wait_job(data / "specui.db", resumed, ("cancelled", "done", "failed"))


def test_training_never_writes_into_an_existing_or_busy_speculator(data_dir) -> None:
    from specui.store import Store
    from specui.ui.train import start_training

    store = Store(data_dir / "specui.db")
    start_training(store, "dflash", "embedded", "demo", 1, 4, 4, 0, 1e-3, "mine", "alice")
    with pytest.raises(SpecUIError, match="already exists or is being trained"):
        start_training(store, "dflash", "embedded", "demo", 1, 4, 4, 0, 1e-3, "mine", "bob")
    (data_dir / "speculators" / "imported").mkdir(parents=True)
    with pytest.raises(SpecUIError, match="already exists"):
        start_training(store, "dflash", "embedded", "demo", 1, 4, 4, 0, 1e-3, "imported", "bob")
    assert len(store.list_jobs()) == 1


def test_admin_mode_lets_the_operator_act_on_any_job(data_dir, monkeypatch) -> None:
    from specui.jobs import queue as jobs
    from specui.store import Store
    from specui.ui.train import resume_training

    store = Store(data_dir / "specui.db")
    job = jobs.enqueue(store, "count", {"n": 1}, owner="alice")
    jobs.cancel(store, job.id, "alice")
    with pytest.raises(SpecUIError, match="belongs to another session"):
        resume_training(store, job.id, "bob")
    monkeypatch.setenv("SPECUI_ADMIN", "1")
    assert resume_training(store, job.id, "bob").owner == "bob"


# --- 4. loopback by default -----------------------------------------------------------------


def test_app_binds_loopback_unless_told_otherwise(monkeypatch) -> None:
    sys.path.insert(0, str(REPO))
    try:
        import app as app_module
    finally:
        sys.path.remove(str(REPO))
    for var in ("SPECUI_HOST", "SPACE_ID", "SPECUI_SHARE", "SPECUI_ADMIN", "SPECUI_MAX_UPLOAD_MB"):
        monkeypatch.delenv(var, raising=False)
    args = app_module.parse_args([])
    assert (args.host, args.share, args.admin, args.max_upload_mb) == (
        "127.0.0.1",
        False,
        False,
        512,
    )
    assert app_module.parse_args(["--host", "0.0.0.0"]).host == "0.0.0.0"
    monkeypatch.setenv("SPECUI_HOST", "::1")
    assert app_module.parse_args([]).host == "::1"
    monkeypatch.setenv("SPECUI_ADMIN", "1")
    monkeypatch.setenv("SPECUI_MAX_UPLOAD_MB", "8")
    args = app_module.parse_args([])
    assert args.admin and args.max_upload_mb == 8


@needs_vllm
def test_vllm_command_binds_loopback_and_keeps_the_api_key_off_it() -> None:
    from specui.vllm.launch_plan import ServerConfig, plan_launch

    argv = plan_launch(ServerConfig(port=8123)).argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    with pytest.raises(SpecUIError, match="refusing to bind"):
        plan_launch(ServerConfig(host="0.0.0.0", port=8123))
    plan = plan_launch(
        ServerConfig(
            host="0.0.0.0", port=8123, allow_remote_bind=True, extra_args=["--api-key", "k-123"]
        )
    )
    assert plan.argv[plan.argv.index("--host") + 1] == "0.0.0.0"
    assert "k-123" not in plan.argv and "k-123" not in plan.command_line
    assert plan.env["VLLM_API_KEY"] == "k-123" == plan.api_key


# --- 6. no secrets in logs, the database or CSV ---------------------------------------------


def _db_dump(db: Path) -> str:
    con = sqlite3.connect(db)
    try:
        return "\n".join(con.iterdump())
    finally:
        con.close()


def test_no_token_in_the_apps_db_logs_or_csv(app) -> None:
    """The app runs with HF_TOKEN set; decode, a background benchmark and the CSV export
    must not write it anywhere."""
    from specui.store import Store

    url, data = app
    client = _client(url)
    run = client.predict(
        "Count to five.", "ngram", "embedded", 0, 8, 0.0, 0, True, api_name="/decode"
    )["run_id"]
    status = client.predict(["ngram"], "demo", 1, 8, 0.0, api_name="/bench_job")
    job_id = int(status.split("job ", 1)[1].split(";")[0])
    assert _wait_job(data / "specui.db", job_id, ("done", "failed"), timeout_s=300) == "done", (
        Store(data / "specui.db").get_job(job_id).error
    )
    csv = client.predict(str(run), api_name="/export")
    assert str(run) in csv
    texts = {"db": _db_dump(data / "specui.db"), "csv": csv}
    texts |= {
        str(p): p.read_text(errors="replace")
        for p in data.rglob("*")
        if p.is_file() and p.suffix in (".log", ".csv", ".jsonl", ".txt")
    }
    assert "app.log" in " ".join(texts)
    leaks = [name for name, text in texts.items() if TOKEN in text]
    assert leaks == [], f"the HF token leaked into {leaks}"


@needs_vllm
@pytest.mark.vllm
def test_no_vllm_api_key_in_logs_db_csv_or_process_list(tmp_path, monkeypatch) -> None:
    """A real vLLM server protected by an API key: benchmarked when launched here and
    when attached; the key is needed (401 without it) and written nowhere."""
    from specui.data import load_prompts
    from specui.metrics.comparison import compare
    from specui.store import Store
    from specui.vllm.bench import run_benchmark
    from specui.vllm.client import BenchSettings
    from specui.vllm.launch_plan import ServerConfig
    from specui.vllm.server import VLLMServer
    from specui.vllm.session import VLLMSlot

    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path))
    key = "sk-" + uuid.uuid4().hex
    hf = "hf_" + uuid.uuid4().hex
    store = Store(tmp_path / "specui.db")
    prompts = load_prompts("demo", split="eval", limit=1)
    server = VLLMServer.launch(
        ServerConfig(extra_args=["--api-key", key], env={"HF_TOKEN": hf}, startup_timeout_s=420)
    )
    try:
        # the key is in force
        assert httpx.get(f"{server.base_url}/v1/models", timeout=10).status_code == 401
        cmdline = Path(f"/proc/{server.server_pid}/cmdline").read_bytes().decode(errors="replace")
        assert "vllm" in cmdline and key not in cmdline
        launched = run_benchmark(
            store,
            server,
            prompts,
            prompt_set="demo",
            verifier="embedded",
            settings=BenchSettings(max_new_tokens=8),
        )
        slot = VLLMSlot()
        slot.attach(server.base_url, key)
        job = slot.bench_current(
            store, prompts="demo", limit=1, settings=BenchSettings(max_new_tokens=8), verifier=None
        )
        deadline = time.monotonic() + 180
        while not job.done:
            assert time.monotonic() < deadline
            time.sleep(0.5)
        assert job.error is None and job.run_ids, job.error
        status = json.dumps(slot.status(), default=str)
        slot.server = None  # the attached handle: the launched server is stopped below
    finally:
        server.stop()
    csv = tmp_path / "runs.csv"
    compare(store, [launched.run_id, *job.run_ids]).to_csv(csv)
    texts = {"db": _db_dump(tmp_path / "specui.db"), "csv": csv.read_text(), "status": status}
    texts |= {str(p): p.read_text(errors="replace") for p in tmp_path.rglob("*.log")}
    assert any(n.endswith(".log") for n in texts) and "api_server" in texts["db"]
    leaks = [
        (name, secret[:3]) for name, text in texts.items() for secret in (key, hf) if secret in text
    ]
    assert leaks == [], f"secrets leaked: {leaks}"
