"""An engine that answers at once: SGLang's native API with a fixed reply, for overhead benchmarks.

``/generate`` returns the configured ids (cut to ``max_new_tokens``) with one fixed logprob per
id, in the response shape of SGLang 0.5 (``output_ids``, ``meta_info.finish_reason``,
``meta_info.output_token_logprobs``); the control routes the engine client uses (abort, pause,
continue, weight version, flush, close_session, health, model_info, server_info) answer success.
There is no model: what a benchmark measures against it is relaxtrio's own cost.

It is a minimal HTTP/1.1 server on trio streams (no web framework, no h11), so that its own CPU
cost per call stays small next to what it is compared with. Run it in-process with
:func:`serve_instant_engine`, or as a process::

    python -m relaxtrio.testing.instant_engine --reply-ids 72 105 2 [--cpu 1]

which prints ``RELAXTRIO_ENGINE_URL=http://127.0.0.1:<port>`` as its first stdout line, like
``python -m relaxtrio.engine``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Sequence
from typing import Any, Final

import attrs
import orjson
import trio

__all__ = ["InstantEngine", "serve_instant_engine"]

URL_LINE_PREFIX: Final = "RELAXTRIO_ENGINE_URL="
_READ_BYTES: Final = 65536
_OK: Final = {"success": True, "message": ""}


@attrs.define(eq=False, kw_only=True)
class InstantEngine:
    """What the instant engine answers, and what it has seen.

    Attributes:
        reply_ids: the ids every generation returns (cut to ``max_new_tokens``); when the
            last one is ``eos_id``, an uncut reply finishes with ``stop``, else ``length``.
        eos_id: the id a ``stop`` finish reports as matched.
        logprob: the logprob reported for every generated id.
        weight_version: the reported weight version.
        num_generate_calls: ``/generate`` calls answered so far.
        num_prompt_tokens: input ids received over all ``/generate`` calls.
    """

    reply_ids: tuple[int, ...] = attrs.field(converter=tuple)
    eos_id: int | None = None
    logprob: float = -0.5
    weight_version: str = "default"
    num_generate_calls: int = 0
    num_prompt_tokens: int = 0

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        """The ``/generate`` answer to one single-form request body."""
        prompt = body.get("input_ids") or ()
        sampling = body.get("sampling_params") or {}
        limit = sampling.get("max_new_tokens")
        ids = list(self.reply_ids if limit is None else self.reply_ids[:limit])
        if len(ids) == len(self.reply_ids) and ids and ids[-1] == self.eos_id:
            finish: dict[str, Any] = {"type": "stop", "matched": self.eos_id}
        else:
            finish = {"type": "length", "length": len(ids)}
        self.num_generate_calls += 1
        self.num_prompt_tokens += len(prompt)
        meta: dict[str, Any] = {
            "id": body.get("rid"),
            "finish_reason": finish,
            "prompt_tokens": len(prompt),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": self.weight_version,
            "e2e_latency": 0.0,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[self.logprob, i, None] for i in ids]
        return {"text": "", "output_ids": ids, "meta_info": meta}

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        """(status, JSON payload) of one request; unknown routes get 404."""
        if path == "/generate" and method == "POST":
            try:
                payload = orjson.loads(body) if body else {}
            except ValueError:
                return 400, {"error": {"message": "invalid JSON body"}}
            problem = _generate_body_problem(payload)
            if problem is not None:
                return 400, {"error": {"message": problem}}
            return 200, self.generate(payload)
        if path in ("/health", "/health_generate"):
            return 200, None
        if path == "/model_info":
            return 200, {"model_path": "instant", "weight_version": self.weight_version,
                         "is_generation": True, "has_image_understanding": False}
        if path == "/server_info":
            return 200, {"model_path": "instant", "context_length": 1 << 20,
                         "max_running_requests": 1 << 16, "status": "ready",
                         "internal_states": [{"num_generate_calls": self.num_generate_calls}]}
        if path in ("/abort_request", "/pause_generation", "/continue_generation", "/flush_cache",
                    "/update_weight_version", "/close_session"):
            return 200, _OK
        return 404, {"error": {"message": f"no route {method} {path}"}}


def _generate_body_problem(payload: Any) -> str | None:
    """What makes ``payload`` an unusable single-form ``/generate`` body, or None."""
    if not isinstance(payload, dict):
        return "the body must be a JSON object"
    prompt = payload.get("input_ids")
    if prompt is not None and not isinstance(prompt, list):  # (its ids are not looked at)
        return "input_ids must be a list"
    sampling = payload.get("sampling_params")
    if sampling is not None and not isinstance(sampling, dict):
        return "sampling_params must be an object"
    limit = (sampling or {}).get("max_new_tokens")
    if limit is not None and not (type(limit) is int and limit >= 0):
        return "sampling_params.max_new_tokens must be a non-negative integer"
    return None


_HEAD_END: Final = b"\r\n\r\n"
_MAX_HEAD_BYTES: Final = 65536
_MAX_BODY_BYTES: Final = 1 << 30
_REASONS: Final = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Content Too Large",
                   431: "Request Header Fields Too Large", 500: "Internal Server Error",
                   501: "Not Implemented"}


class _BadRequest(Exception):
    """A request this server cannot read: answered with ``status`` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _response(status: int, payload: Any, *, close: bool) -> bytes:
    """One HTTP/1.1 response with a JSON body (none for a None payload)."""
    body = b"" if payload is None else orjson.dumps(payload)
    connection = "Connection: close\r\n" if close else ""
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{connection}\r\n")
    return head.encode("ascii") + body


def _parse_head(head: str) -> tuple[str, str, int, bool]:
    """(method, path, Content-Length, close after the response) of a request's head.

    Raises:
        _BadRequest: a malformed request line or Content-Length (400), a chunked body (501).
    """
    request_line, *lines = head.split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest(400, f"malformed request line {request_line[:80]!r}")
    method, target, version = parts
    length: int | None = None
    close = version != "HTTP/1.1"
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadRequest(400, f"malformed header line {line[:80]!r}")
        name, value = name.strip().lower(), value.strip()
        if name == "content-length":
            if not (value.isascii() and value.isdigit()) or (length is not None and int(value) != length):
                raise _BadRequest(400, f"invalid or repeated Content-Length {value[:40]!r}")
            length = int(value)
            if length > _MAX_BODY_BYTES:
                raise _BadRequest(413, f"a body of {length} bytes is larger than {_MAX_BODY_BYTES}")
        elif name == "transfer-encoding":
            raise _BadRequest(501, "only Content-Length bodies are supported")
        elif name == "connection":
            close = value.lower() == "close" or (close and value.lower() != "keep-alive")
    return method, target.split("?", 1)[0], length or 0, close


async def _serve_connection(engine: InstantEngine, stream: trio.SocketStream) -> None:
    """Answer keep-alive requests on one connection until the client closes it.

    A minimal HTTP/1.1 reader (request line, headers, a Content-Length body; no chunked bodies,
    which neither the engine client nor httpx send for JSON): h11 cost about half of this
    server's CPU per call, which the full path's latency at one client carries.
    """
    buffer = bytearray()
    try:
        while True:
            end = buffer.find(_HEAD_END)
            while end < 0:
                if len(buffer) > _MAX_HEAD_BYTES:
                    raise _BadRequest(431, "request head too large")
                if b"\n\n" in buffer:
                    raise _BadRequest(400, "header lines must end with CRLF")
                data = await stream.receive_some(_READ_BYTES)
                if not data:
                    return
                buffer += data
                end = buffer.find(_HEAD_END)
            if end > _MAX_HEAD_BYTES:
                raise _BadRequest(431, "request head too large")
            method, path, length, close = _parse_head(buffer[:end].decode("latin-1"))
            del buffer[: end + len(_HEAD_END)]
            while len(buffer) < length:
                data = await stream.receive_some(_READ_BYTES)
                if not data:
                    return
                buffer += data
            body = bytes(buffer[:length])
            del buffer[:length]
            try:
                status, payload = engine.answer(method, path, body)
            except Exception as exc:  # noqa: BLE001 - a fault answers this request; the server goes on
                status, payload = 500, {"error": {"message": f"{type(exc).__name__}: {exc}"}}
            await stream.send_all(_response(status, payload, close=close))
            if close:
                return
    except _BadRequest as exc:
        with contextlib.suppress(trio.BrokenResourceError, OSError):
            await stream.send_all(_response(exc.status, {"error": {"message": str(exc)}}, close=True))
    except (trio.BrokenResourceError, OSError):
        return
    finally:
        await trio.aclose_forcefully(stream)


async def serve_instant_engine(
    engine: InstantEngine,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``engine`` until cancelled; reports ``http://host:port`` once listening.

    Cancellation:
        Cancelling closes the listener and every connection.
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound_port = listeners[0].socket.getsockname()[1]

    async def handler(stream: trio.SocketStream) -> None:
        await _serve_connection(engine, stream)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        task_status.started(f"http://{host}:{bound_port}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m relaxtrio.testing.instant_engine``: serve until SIGTERM / Ctrl-C."""
    parser = argparse.ArgumentParser(description="An SGLang-API engine that answers at once.")
    parser.add_argument("--reply-ids", type=int, nargs="+", required=True)
    parser.add_argument("--eos-id", type=int, default=None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cpu", type=int, default=None, help="pin the process to this CPU")
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    engine = InstantEngine(reply_ids=args.reply_ids, eos_id=args.eos_id)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(functools.partial(serve_instant_engine, engine, port=args.port))
            print(URL_LINE_PREFIX + url, flush=True)

    try:
        trio.run(run)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
