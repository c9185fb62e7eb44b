"""A small Hugging Face hub on loopback: the parts of the hub's HTTP API that
``huggingface_hub`` (and transformers through it) uses to read a model's metadata and to
download its files, served from bytes the test provides.

Point a process at it with ``HF_ENDPOINT=hub.url``.  Each repository is a dict of file name
to bytes; ``listed_sizes`` makes the file list and the HEAD answers report other sizes than
the bytes served (a "140 GB" model whose safetensors header says so, without 140 GB
anywhere).  Every request is recorded, so a test can say which files were fetched and
whether any weight bytes were asked for (``weight_requests``); a repository's ``delay_s``
spreads each whole-file download from it over that long (a slow hub: metadata stays quick).
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
METADATA_READ = 100_001  # bytes huggingface_hub's first ranged read of a safetensors file asks


@dataclass
class Repo:
    files: dict[str, bytes]
    listed_sizes: dict[str, int] = field(default_factory=dict)
    delay_s: float = 0.0

    def size(self, name: str) -> int:
        return self.listed_sizes.get(name, len(self.files[name]))


@dataclass
class Request:
    method: str
    repo: str
    path: str  # the file (resolve) or API route
    range: str | None


def safetensors_header_only(tensors: dict[str, tuple[str, list[int]]]) -> tuple[bytes, int]:
    """The first bytes of a safetensors file whose header lists ``tensors`` (name: dtype,
    shape) with no data after it, and the size the whole file would have."""
    sizes = {"F32": 4, "BF16": 2, "F16": 2}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    head = struct.pack("<Q", len(raw)) + raw
    return head, len(head) + offset


def header_length(data: bytes) -> int:
    """Bytes of a safetensors file before its first tensor (8 + the header)."""
    return 8 + struct.unpack("<Q", data[:8])[0]


class LoopbackHub:
    """The server, started on a free port of 127.0.0.1 for the ``with`` block."""

    def __init__(self, repos: dict[str, Repo]) -> None:
        self.repos = repos
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet: the test reads hub.requests
                pass

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
                hub._answer(self, head=True)

            def do_GET(self) -> None:  # noqa: N802
                hub._answer(self, head=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> LoopbackHub:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # --- what the test reads ------------------------------------------------------------

    def fetched(self, repo: str) -> list[str]:
        """Files of ``repo`` a GET asked for (ranged reads included)."""
        with self._lock:
            return [r.path for r in self.requests if r.repo == repo and r.method == "GET"]

    def weight_requests(self, repo: str) -> list[Request]:
        """GETs of ``repo``'s safetensors files that asked for bytes past the header."""
        out = []
        with self._lock:
            requests = [r for r in self.requests if r.repo == repo and r.method == "GET"]
        for r in requests:
            files = self.repos[repo].files
            if not r.path.endswith(".safetensors") or r.path not in files:
                continue
            # huggingface_hub reads a file's first 100 kB for its header: metadata, not weights.
            end = _range_end(r.range)
            if end is None or end >= max(header_length(files[r.path]), METADATA_READ):
                out.append(r)
        return out

    # --- serving ------------------------------------------------------------------------

    def _answer(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        api = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
        tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/[^/]+(?:/(.*))?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path)
        match = api or tree or resolve
        repo_id = match.group(1) if match else ""
        with self._lock:
            self.requests.append(
                Request(
                    h.command, repo_id, resolve.group(2) if resolve else path, h.headers["Range"]
                )
            )
        repo = self.repos.get(repo_id)
        if repo is None:
            return _send(
                h, 404, b'{"error":"Repository not found"}', {"X-Error-Code": "RepoNotFound"}
            )
        if api:
            siblings = [{"rfilename": n, "size": repo.size(n)} for n in sorted(repo.files)]
            body = {"id": repo_id, "modelId": repo_id, "sha": COMMIT, "siblings": siblings}
            return _send(h, 200, json.dumps(body).encode(), {}, head)
        if tree:
            prefix = (tree.group(2) or "").strip("/")
            entries = [
                {"type": "file", "path": n, "size": repo.size(n), "oid": _etag(repo.files[n])}
                for n in sorted(repo.files)
                if not prefix or n.startswith(prefix + "/")
            ]
            if prefix and not entries:
                return _send(h, 404, b"{}", {"X-Error-Code": "EntryNotFound"}, head)
            return _send(h, 200, json.dumps(entries).encode(), {}, head)
        name = resolve.group(2)
        if name not in repo.files:
            return _send(h, 404, b"{}", {"X-Error-Code": "EntryNotFound"}, head)
        data = repo.files[name]
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{_etag(data)}"', "Accept-Ranges": "bytes"}
        if head:
            headers["Content-Length"] = str(repo.size(name))
            return _send(h, 200, b"", headers, head=True)
        lo_hi = _range(h.headers["Range"], len(data))
        if lo_hi is None:
            return _send(h, 200, data, headers, spread_s=repo.delay_s)
        lo, hi = lo_hi
        headers["Content-Range"] = f"bytes {lo}-{hi}/{repo.size(name)}"
        return _send(h, 206, data[lo : hi + 1], headers)


def _etag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _range(value: str | None, size: int) -> tuple[int, int] | None:
    m = re.fullmatch(r"bytes=(\d+)-(\d*)", value or "")
    if not m:
        return None
    lo = int(m.group(1))
    hi = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
    return lo, hi


def _range_end(value: str | None) -> int | None:
    m = re.fullmatch(r"bytes=(\d+)-(\d*)", value or "")
    return int(m.group(2)) if m and m.group(2) else None


# The longest pause between two pieces of a slow download: huggingface_hub gives up on a read
# that waits HF_HUB_DOWNLOAD_TIMEOUT (10 s) for a byte and tries again, so a server silent for
# all of a 20 s delay is never downloaded from (the fetch fails after its retries).
SLOW_PIECE_S = 0.5


def _send(
    h, status: int, body: bytes, headers: dict[str, str], head: bool = False, spread_s: float = 0
) -> None:
    """Answer ``status`` with ``body``; ``spread_s``: the body trickles out over that many
    seconds, the headers at once (a slow link: a download that takes that long, read by read)."""
    h.send_response(status)
    if "Content-Length" not in headers:
        headers = {**headers, "Content-Length": str(len(body))}
    headers.setdefault("Content-Type", "application/json")
    for k, v in headers.items():
        h.send_header(k, v)
    h.end_headers()
    if head:
        return
    pieces = max(1, min(len(body), round(spread_s / SLOW_PIECE_S))) if spread_s > 0 else 1
    step = -(-len(body) // pieces) if body else 0
    for i in range(pieces):
        if spread_s > 0:
            time.sleep(spread_s / pieces)
        try:
            h.wfile.write(body[i * step : (i + 1) * step])
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return  # the client went away mid-download (an app stopped while a load pends)
