"""Pieces every protocol module shares: the parsed request, ids, JSON and SSE framing.

Each protocol module (:mod:`.chat`, :mod:`.responses`, :mod:`.messages`) exposes one
:class:`ProtocolAdapter`; the app and the Buffered SSE body only talk to adapters, so JSON and
SSE share normalization, the turn, the commit, usage and finish reason
(docs/agent-contract.md#buffered-sse).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs
import orjson

from .._errors import RelaxError
from ..nursery.turns import TurnRequest, TurnResult
from .options import IgnoredField
from .session_memo import SessionMemo

Protocol = Literal["chat", "responses", "messages"]


@attrs.frozen(kw_only=True)
class ParsedRequest:
    """A request of any protocol, normalized.

    Attributes:
        turn: the canonical turn (history, tools, template kwargs, limits).
        model: the request's ``model``; echoed back, it never selects a backend.
        stream: whether Buffered SSE was asked for (``stream: true``).
        custom_tools: names of the request's freeform (Responses ``custom``) tools; their calls
            are rendered as ``custom_tool_call`` items.
        namespaces: the function tools of the request's Responses ``namespace`` tools, by name →
            their namespace; their calls are rendered with the namespace (Codex's sub-agent tools).
        ignored: options of the request that do not alter generation (:mod:`.options`); the
            app reports them, or refuses the first under ``--agentic-strict-request-fields``.
        echo_tools: the request's ``tools`` entries as sent, hosted ones included (Responses
            echoes them in its response object); the body's own objects, only read.
    """

    turn: TurnRequest
    model: str | None = None
    stream: bool = False
    custom_tools: frozenset[str] = frozenset()
    namespaces: Mapping[str, str] = attrs.field(factory=dict)
    ignored: tuple[IgnoredField, ...] = ()
    echo_tools: tuple[Any, ...] = ()


@attrs.frozen(kw_only=True)
class ProtocolAdapter:
    """Everything the app needs to serve one protocol.

    Attributes:
        name: ``chat``, ``responses`` or ``messages`` (selects the error envelope).
        parse: ``(request body, the Session's memo or None)`` →
            :class:`ParsedRequest`; raises ``InvalidRequestError``.
        render_json: committed turn → the protocol's JSON response object.
        render_sse: committed turn → the complete terminal SSE sequence (bytes).
        render_sse_error: error → the protocol's in-stream failure sequence (bytes).
        connected_frame: the SSE frame sent as soon as the stream opens.
        heartbeat_frame: the SSE frame sent every heartbeat while the turn is pending.
    """

    name: Protocol
    parse: Callable[[Mapping[str, Any], SessionMemo | None], ParsedRequest]
    render_json: Callable[[TurnResult, ParsedRequest], dict[str, Any]]
    render_sse: Callable[[TurnResult, ParsedRequest], bytes]
    render_sse_error: Callable[[RelaxError, ParsedRequest | None], bytes]
    connected_frame: bytes
    heartbeat_frame: bytes


def new_id(prefix: str) -> str:
    """A fresh response/item id, ``<prefix>_<32 hex>``: 128 bits of :mod:`random`'s generator
    (seeded from the OS at start and again in a forked child), as unique as a UUID4's hex,
    without its ``getrandom`` call per id (about 1% of a turn's CPU). Not a secret: Session
    tokens do not come from here."""
    return f"{prefix}_{random.getrandbits(128):032x}"


def dumps(payload: Any) -> str:
    """Compact JSON text with non-ASCII characters kept."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def encode_json(payload: Any) -> bytes:
    """``payload`` as compact UTF-8 JSON bytes.

    orjson writes it (the same text as :func:`dumps` for the JSON types responses hold, several
    times faster); what orjson refuses (a lone surrogate echoed from a request, an integer
    beyond 64 bits, a type it does not know) goes through :func:`json.dumps`, where text that
    UTF-8 cannot carry is written with ``\\uXXXX`` escapes, so encoding a response never fails.
    orjson writes a non-finite float as ``null`` (``json`` would write ``NaN``, which is not
    JSON).
    """
    try:
        return orjson.dumps(payload)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        pass
    text = dumps(payload)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(payload, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def sse_comment(text: str) -> bytes:
    """An SSE comment frame (``: text``), ignored by SSE parsers; used as keep-alive."""
    return f": {text}\n\n".encode()


def sse_data(payload: Any) -> bytes:
    """An unnamed SSE event carrying compact JSON (Chat Completions chunks)."""
    return b"data: " + encode_json(payload) + b"\n\n"


def sse_event(name: str, payload: Any) -> bytes:
    """A named SSE event, ``event: <name>\\ndata: <compact json>\\n\\n``."""
    return f"event: {name}\ndata: ".encode() + encode_json(payload) + b"\n\n"
