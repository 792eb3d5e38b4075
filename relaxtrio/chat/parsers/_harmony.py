"""gpt-oss output (the harmony format): messages on the analysis, commentary and final channels.

The generation prompt ends with ``<|start|>assistant``, so a reply is a sequence of messages, the
first without its ``<|start|>assistant``::

    <|channel|>analysis<|message|>REASONING<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS
    <|start|>assistant<|channel|>final<|message|>ANSWER

A message ends with ``<|end|>``, ``<|call|>`` or ``<|return|>``; the last two are stop tokens and
so are missing from the decoded text of the message that stopped the generation. The recipient
(``to=functions.NAME``) may sit before or after the channel in the header, and the published chat
template writes it before (``<|start|>assistant to=functions.NAME<|channel|>commentary json``).

Reasoning parser ``gpt-oss`` (:func:`parse_harmony_reasoning`): analysis messages become the
reasoning; final messages and commentary messages without a recipient (preambles) become the
content; messages addressed to a tool stay in the content in canonical raw form
(``<|start|>assistant`` + header + ``<|message|>`` + body + ``<|call|>``) for the tool-call parser.
Tool-call parser ``gpt-oss`` (:func:`split_harmony`): every message addressed to ``functions.NAME``
is a call whose body is the JSON arguments. A text without ``<|message|>`` is not harmony and is
returned unchanged by both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

from ._formats import Candidate, Segment, Text, _call_from_object
from ._json import loads_strict

START: Final = "<|start|>"
MESSAGE: Final = "<|message|>"
_ENDS: Final = ("<|end|>", "<|call|>", "<|return|>")
_CHANNEL: Final = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_RECIPIENT: Final = re.compile(r"(?:^|\s)to=([^\s<]+)")
_ROLE: Final = "assistant"


@attrs.frozen
class HarmonyMessage:
    """One message of a reply.

    Attributes:
        raw: its exact text (``<|start|>assistant`` included when the text had it).
        header: the text between the role and ``<|message|>``.
        channel: ``analysis``, ``commentary``, ``final``, or "" when the header names none.
        recipient: ``functions.NAME`` and the like, or None.
        body: the text between ``<|message|>`` and the end token (or the end of the text).
    """

    raw: str
    header: str
    channel: str
    recipient: str | None
    body: str


def split_messages(text: str) -> list[HarmonyMessage | str] | None:
    """The reply's messages in order, with any text that is not a message as plain strings.

    Returns:
        None when ``text`` holds no ``<|message|>`` (it is not harmony output).
    """
    if MESSAGE not in text:
        return None
    pieces: list[HarmonyMessage | str] = []
    chunks = text.split(START)
    for k, chunk in enumerate(chunks):
        raw = chunk if k == 0 else START + chunk
        if not raw:
            continue
        header_end = chunk.find(MESSAGE)
        if header_end < 0:
            pieces.append(raw)
            continue
        header = chunk[:header_end]
        if k > 0:
            header = header.removeprefix(_ROLE)
        body = chunk[header_end + len(MESSAGE) :]
        rest = ""
        cuts = [(body.find(token), token) for token in _ENDS if token in body]
        if cuts:
            cut, token = min(cuts)
            body, rest = body[:cut], body[cut + len(token) :]  # the end token stays with its message
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        pieces.append(HarmonyMessage(
            raw[: len(raw) - len(rest)],
            header,
            channel.group(1) if channel else "",
            recipient.group(1) if recipient else None,
            body,
        ))
        if rest:
            pieces.append(rest)
    return pieces


def parse_harmony_reasoning(text: str, *, cut: bool = False) -> tuple[str | None, str]:
    """``(reasoning, content)`` of a reply (see the module doc); reasoning is None when empty.

    ``cut``: the generation was cut (finish ``length``), so a last message addressed to a tool
    without an end token is unfinished: it stays in the content exactly as generated, never
    closed with a ``<|call|>`` the model did not write
    (docs/client-quirks.md#a-tool-call-cut-by-the-token-limit).
    """
    pieces = split_messages(text)
    if pieces is None:
        return None, text
    reasoning: list[str] = []
    content: list[str] = []
    for index, piece in enumerate(pieces):
        if isinstance(piece, str):
            content.append(piece)
        elif piece.recipient is not None and cut and index == len(pieces) - 1 and not piece.raw.endswith(_ENDS):
            content.append(piece.raw)
        elif piece.recipient is not None:
            content.append(f"{START}{_ROLE}{piece.header}{MESSAGE}{piece.body}<|call|>")
        elif piece.channel == "analysis":
            reasoning.append(piece.body.strip())
        else:
            content.append(piece.body)
    joined = "\n\n".join(part for part in reasoning if part)
    return (joined or None), "".join(content).strip()


def split_harmony(text: str, tools: Mapping[str, Mapping[str, Any]]) -> list[Segment]:
    """Tool-call splitter: each message addressed to ``functions.NAME`` is one call candidate."""
    del tools
    pieces = split_messages(text)
    if pieces is None:
        return [Text(text)]
    segments: list[Segment] = []
    for piece in pieces:
        if isinstance(piece, str):
            segments.append(Text(piece))
        elif piece.recipient is None or not piece.recipient.startswith("functions."):
            segments.append(Text(piece.raw))
        else:
            name = piece.recipient.removeprefix("functions.")
            try:
                arguments = loads_strict(piece.body) if piece.body.strip() else {}
                call = _call_from_object({"name": name, "arguments": arguments})
            except ValueError as exc:
                segments.append(Candidate(piece.raw, error=str(exc)))
            else:
                segments.append(Candidate(piece.raw, calls=(call,)))
    return segments
