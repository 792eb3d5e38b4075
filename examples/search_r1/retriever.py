"""The retriever of examples/search_r1: one BM25 (``bm25s``) index over ``data/corpus.jsonl`` behind
a small HTTP API, shared by every Session of a run.

It is a cross-session service: start it once, before the run, outside the per-Session agent
command (``launch.sh`` does), and hand its URL to the agents with ``--agent-env
RETRIEVER_URL=...``. The index is built once at start-up; requests are answered concurrently
(one thread each).

API (JSON):

- ``POST /retrieve`` ``{"query": str, "topk": int (default 3, 1..10)}`` → ``{"results": [{"id",
  "title", "text", "score"}, ...]}``, best first; 400 naming the field for a bad body.
- ``GET /health`` → ``{"documents": int, "requests": int}`` (``requests``: retrievals answered so far).

Run: ``python retriever.py [--host 127.0.0.1] [--port 8000] [--corpus data/corpus.jsonl]``; it prints
``retriever listening on http://HOST:PORT`` once it accepts connections (``--port 0``: a free port).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import bm25s

HERE = Path(__file__).resolve().parent
MAX_TOPK = 10


class Index:
    """A BM25 index over passages ``{"id", "title", "text"}`` (the title is indexed with the text)."""

    def __init__(self, passages: list[dict[str, str]]) -> None:
        if not passages:
            raise ValueError("the corpus has no passages")
        self.passages = passages
        self._bm25 = bm25s.BM25()
        self._bm25.index(self._tokens([f"{p['title']}. {p['text']}" for p in passages]), show_progress=False)
        self._lock = threading.Lock()  # bm25s' retrieve is not documented as thread-safe
        self.requests = 0

    @staticmethod
    def _tokens(texts: list[str]) -> Any:
        return bm25s.tokenize(texts, stopwords="en", show_progress=False)

    def search(self, query: str, topk: int = 3) -> list[dict[str, Any]]:
        """The ``topk`` best passages for ``query``, best first, each with its BM25 ``score``;
        passages sharing no word with the query (score 0) are left out, so the list may be shorter
        or empty."""
        k = min(topk, len(self.passages))
        with self._lock:
            self.requests += 1
            ids, scores = self._bm25.retrieve(self._tokens([query]), k=k, show_progress=False)
        return [dict(self.passages[int(i)], score=round(float(s), 4))
                for i, s in zip(ids[0], scores[0], strict=True) if s > 0]


def load_corpus(path: Path) -> list[dict[str, str]]:
    """The passages of a JSONL corpus (one ``{"id", "title", "text"}`` per line)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def parse_request(body: bytes) -> tuple[str, int]:
    """``(query, topk)`` from a ``/retrieve`` body.

    Raises:
        ValueError: the body is not a JSON object, ``query`` is not a non-empty string, or ``topk``
            is not an integer in 1..10; the message names the field.
    """
    try:
        request = json.loads(body or b"null")
    except json.JSONDecodeError as exc:
        raise ValueError(f"body: not JSON ({exc})") from None
    if not isinstance(request, dict):
        raise ValueError("body: expected a JSON object")
    query, topk = request.get("query"), request.get("topk", 3)
    if not isinstance(query, str) or not query.strip():
        raise ValueError("query: expected a non-empty string")
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"topk: expected an integer from 1 to {MAX_TOPK}")
    return query, topk


def make_handler(index: Index) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path != "/health":
                self._reply(404, {"error": f"no route {self.path}"})
                return
            self._reply(200, {"documents": len(index.passages), "requests": index.requests})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/retrieve":
                self._reply(404, {"error": f"no route {self.path}"})
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                query, topk = parse_request(body)
            except ValueError as exc:
                self._reply(400, {"error": str(exc)})
                return
            self._reply(200, {"results": index.search(query, topk)})

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # one line per request would drown the run's log

    return Handler


def exit_with_launcher(poll_s: float = 1.0) -> None:
    """Exits the process once its parent (the launcher) is gone: a launcher killed with SIGKILL
    runs no cleanup, and the retriever must not outlive the run it serves."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(0)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--corpus", type=Path, default=HERE / "data" / "corpus.jsonl")
    args = parser.parse_args()
    exit_with_launcher()
    index = Index(load_corpus(args.corpus))
    server = ThreadingHTTPServer((args.host, args.port), make_handler(index))
    host, port = server.server_address[:2]
    print(f"retriever listening on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()
