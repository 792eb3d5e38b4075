"""Images in a request to a text-only policy (``--agentic-text-only-images``).

Harnesses send images the policy cannot take: Claude Code reads a PNG and returns it in a
``tool_result``, Codex attaches a screenshot. ``refuse`` answers such a request with a 400 (the
compiler's check; the CLI usually exits and its Session ends). ``marker`` shows the model a fixed
text, :data:`~relaxtrio.media.images.IMAGE_MARKER`, in place of each image, as opencode does
itself for models not marked image-capable. The replacement is made on every request, so the
agent's repeated history keeps matching the committed observations
(docs/client-quirks.md#images-sent-to-a-text-only-policy).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..forest import Conversation
from ..media.images import IMAGE_MARKER, images_as_text


def text_only_view(conv: Conversation, *, policy: str, has_vision: bool) -> Conversation:
    """``conv`` as a text-only model is shown it under ``policy``: unchanged for a vision model,
    under ``refuse``, or without images; else every image part becomes the marker text.

    Raises:
        InvalidRequestError: the replaced messages do not canonicalize (not expected: only parts
            of already canonical messages change).
    """
    if has_vision or policy != "marker" or not any(
            isinstance(m.get("content"), (list, tuple)) for m in conv.messages):
        return conv
    messages, replaced = images_as_text(conv.messages)
    if not replaced:
        return conv
    return Conversation.from_wire(messages, list(conv.tools), dict(conv.template_kwargs))


def count_markers(messages: Iterable[Mapping[str, Any]]) -> int:
    """How many image markers ``messages`` hold (text parts or string content)."""
    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += content.count(IMAGE_MARKER)
        elif isinstance(content, (list, tuple)):
            total += sum(str(p.get("text", "")).count(IMAGE_MARKER) for p in content if isinstance(p, Mapping))
    return total
