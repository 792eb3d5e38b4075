"""OpenAI Chat Completions: request → :class:`ParsedRequest`, :class:`TurnResult` → response.

Request (https://platform.openai.com/docs/api-reference/chat/create; our subset:
docs/agent-contract.md#chat-completions): ``messages`` (complete history), ``tools``,
``chat_template_kwargs``, ``max_completion_tokens`` (legacy ``max_tokens``; the newer field wins),
``stop``, ``seed`` and ``logprobs`` are honoured. ``temperature``, ``top_p``,
``parallel_tool_calls``, ``stream_options`` and every other field are accepted and do not alter
generation (the training configuration owns sampling). Options that ask for what relaxtrio does
not do (``n`` above 1, ``top_logprobs`` above 0, ``tool_choice`` other than ``auto`` or ``none``
without tools, a ``response_format`` schema, the legacy ``functions``) are ignored and reported on
the parsed request, or 400s naming them under ``--agentic-strict-request-fields``
(:func:`.options.check_chat_options`, docs/agent-contract.md#ignored-request-fields); a ``tools``
entry that is not a named function tool (with an object or null ``parameters``, a string or null
``description``) is a 400 naming the field in either mode. ``model`` is echoed. A ``developer`` message is rejected:
the harness must map it to ``system`` (docs/client-quirks.md#developer-messages). A ``tool``
message must name its ``tool_call_id`` (required by the API; a 400 naming
``messages[i].tool_call_id`` otherwise), as Responses' ``call_id`` and Messages' ``tool_use_id``,
and the id must be that of a tool call of an earlier assistant message in the request (a 400
naming ``messages[i].tool_call_id`` otherwise, as OpenAI refuses it). A content part's ``type`` must be
one of the API's (:data:`CHAT_PART_TYPES`; a 400 naming ``messages[i].content[j].type``
otherwise, as OpenAI answers): the chat template would show the model nothing for an unknown part.

Response: ``chat.completion`` JSON or, with ``stream: true``, one complete ``chat.completion.chunk``
with usage followed by ``data: [DONE]`` (docs/agent-contract.md#buffered-sse;
https://platform.openai.com/docs/api-reference/chat-streaming). Tool-call ids are the committed ids,
so the agent's echo of the message matches the committed state.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

from .._errors import InvalidRequestError, RelaxError
from ..forest import Conversation, MessageRules
from ..nursery.turns import TurnRequest, TurnResult
from .errors import openai_error_body
from .fields import optional_bool, optional_positive_int, optional_seed, optional_str, stop_strings
from .options import check_chat_options
from .projection import check_tool_results
from .session_memo import SessionMemo
from .wire import ParsedRequest, ProtocolAdapter, new_id, sse_comment, sse_data

DONE_FRAME: Final = b"data: [DONE]\n\n"

CHAT_PART_TYPES: Final = frozenset({"text", "image_url", "input_audio", "file", "refusal"})
"""The content-part types of the Chat Completions API (the openai SDK's content-part params)."""

_CHAT_RULES: Final = MessageRules(require_tool_call_id=True, part_types=CHAT_PART_TYPES)


def parse_chat_request(body: Mapping[str, Any], memo: SessionMemo | None = None) -> ParsedRequest:
    """Normalizes a Chat Completions body; never mutates it.

    Args:
        body: the decoded request body.
        memo: the Session's memo of its previous request (repeated messages are not
            canonicalized again); None canonicalizes everything.

    Raises:
        InvalidRequestError: any invalid field, with ``param`` set to its path
            (``messages[3].content``, ``max_tokens``, ``chat_template_kwargs``...).
    """
    ignored = check_chat_options(body)
    if body.get("messages") is None:  # the API requires it; "projected to zero" would mislead
        raise InvalidRequestError("messages is required and must be a list", param="messages")
    build = Conversation.from_wire if memo is None else memo.conversation
    conversation = build(body.get("messages"), body.get("tools"), body.get("chat_template_kwargs"),
                         rules=_CHAT_RULES)
    if not conversation.messages:
        raise InvalidRequestError("messages projected to zero supported messages", param="messages")
    check = check_tool_results if memo is None else memo.check_tool_results
    check(body["messages"], "messages[{}].tool_call_id".format)
    max_completion = optional_positive_int(body, "max_completion_tokens")
    max_legacy = optional_positive_int(body, "max_tokens")
    turn = TurnRequest(
        conversation=conversation,
        max_new_tokens=max_completion if max_completion is not None else max_legacy,
        stop=stop_strings(body, "stop"),
        seed=optional_seed(body),
        logprobs=optional_bool(body, "logprobs"),
        protocol="chat",
    )
    return ParsedRequest(turn=turn, model=optional_str(body, "model"), stream=optional_bool(body, "stream"),
                         ignored=ignored)


def chat_message(result: TurnResult) -> dict[str, Any]:
    """The assistant message as Chat Completions returns it.

    ``content`` is None when the turn only called tools (OpenAI's convention); the agent's echo
    with ``content: null`` canonicalizes to the committed ``""``.
    """
    msg = result.message
    out: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or None}
    if msg.get("reasoning_content"):
        out["reasoning_content"] = msg["reasoning_content"]
    if msg.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]},
            }
            for call in msg["tool_calls"]
        ]
    elif out["content"] is None:
        out["content"] = ""
    return out


def chat_logprobs(result: TurnResult) -> dict[str, Any] | None:
    """Chat ``choices[0].logprobs`` (only when the request asked for logprobs).

    See docs/client-quirks.md#logprobs-of-the-content-only.
    """
    if result.logprobs is None:
        return None
    return {
        "content": [
            {
                "token": entry.token,
                "logprob": entry.logprob,
                "bytes": list(entry.token.encode("utf-8", errors="replace")),
                "top_logprobs": [],
            }
            for entry in result.logprobs
        ],
        "refusal": None,
    }


def chat_usage(result: TurnResult) -> dict[str, int]:
    """Usage: the lineage prefix as prompt tokens (docs/agent-contract.md#usage-and-finish-reasons)."""
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def render_chat_completion(result: TurnResult, request: ParsedRequest) -> dict[str, Any]:
    """The ``chat.completion`` object for a committed turn."""
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": [
            {
                "index": 0,
                "message": chat_message(result),
                "logprobs": chat_logprobs(result),
                "finish_reason": result.finish_reason,
            }
        ],
        "usage": chat_usage(result),
    }


def render_chat_sse(result: TurnResult, request: ParsedRequest) -> bytes:
    """The terminal sequence: one complete chunk (delta = whole message, usage) and [DONE]."""
    delta = chat_message(result)
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]
    chunk = {
        "id": new_id("chatcmpl"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": request.model,
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": chat_logprobs(result),
                "finish_reason": result.finish_reason,
            }
        ],
        "usage": chat_usage(result),
    }
    return sse_data(chunk) + DONE_FRAME


def render_chat_sse_error(exc: RelaxError, request: ParsedRequest | None) -> bytes:
    """An in-stream failure: the OpenAI error envelope as data, then [DONE]."""
    return sse_data(openai_error_body(exc)) + DONE_FRAME


CHAT: Final = ProtocolAdapter(
    name="chat",
    parse=parse_chat_request,
    render_json=render_chat_completion,
    render_sse=render_chat_sse,
    render_sse_error=render_chat_sse_error,
    connected_frame=sse_comment("connected"),
    heartbeat_frame=sse_comment("heartbeat"),
)
"""The Chat Completions adapter."""
