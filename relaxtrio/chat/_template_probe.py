"""Probes run once per chat template: how it wants tool-call arguments, and how a turn ends.

Both render small fixed conversations with the template itself, so they adapt to templates
relaxtrio has never seen (some templates iterate ``arguments|items`` and need a mapping, others
concatenate a string: docs/client-quirks.md#tool-call-arguments-mapping-or-string).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from .._errors import InvalidRequestError
from ._template_inputs import ArgumentsForm

logger = logging.getLogger(__name__)

_PROBE_TEXT: Final[str] = "relaxtrio-probe-text"
_PROBE_KEY: Final[str] = "relaxtrio_probe_key"

RenderText = Callable[[list[Any], Sequence[Mapping[str, Any]], Mapping[str, Any], bool], tuple[str, float]]
EncodeText = Callable[[str], tuple[tuple[int, ...], float]]


def probe_arguments_form(render_text: RenderText, prefix: Sequence[Mapping[str, str]]) -> ArgumentsForm:
    """``"mapping"`` unless the template prints a mapping argument as a Python repr (then ``"string"``).

    Args:
        render_text: ``(messages, tools, kwargs, add_generation_prompt) -> (text, seconds)``.
        prefix: the dummy conversation to render after.
    """
    tool = {"type": "function", "function": {"name": "probe", "parameters": {"type": "object", "properties": {}}}}
    call = {"id": "call_probe", "type": "function", "function": {"name": "probe", "arguments": "{}"}}
    for form in ("mapping", "string"):
        arguments: Any = {_PROBE_KEY: 1} if form == "mapping" else json.dumps({_PROBE_KEY: 1})
        probe_call = {**call, "function": {"name": "probe", "arguments": arguments}}
        assistant = {"role": "assistant", "content": "", "tool_calls": [probe_call]}
        messages = [*prefix, assistant, {"role": "tool", "tool_call_id": "call_probe", "content": "ok"}]
        try:
            text, _ = render_text(messages, [tool], {}, True)
        except InvalidRequestError:
            continue
        if f"'{_PROBE_KEY}'" not in text:
            return form  # a mapping printed as a Python repr means the template wants a string
    return "mapping"


def probe_turn_end(
    render_text: RenderText,
    encode: EncodeText,
    prefix: Sequence[Mapping[str, str]],
    stop_token_ids: Sequence[int],
) -> int | None:
    """The stop id the template writes right after an assistant turn's text, or None.

    Args:
        render_text: ``(messages, tools, kwargs, add_generation_prompt) -> (text, seconds)``.
        encode: ``text -> (ids, seconds)`` without special tokens added.
        prefix: the dummy conversation to render after.
        stop_token_ids: the ids that count as an end of turn.
    """
    messages = [*prefix, {"role": "assistant", "content": _PROBE_TEXT}]
    try:
        text, _ = render_text(messages, [], {}, False)
    except InvalidRequestError:
        logger.warning("chat template cannot render a plain assistant turn; turn end unknown")
        return None
    position = text.rfind(_PROBE_TEXT)
    if position < 0:
        return None
    after, _ = encode(text[position + len(_PROBE_TEXT):])
    if after and after[0] in stop_token_ids:
        return after[0]
    return None
