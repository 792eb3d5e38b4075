"""Inputs for chat templates: message copies, tool-call argument forms, kwargs checks, stop ids.

Private helpers of :mod:`relaxtrio.chat.compiler`.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from .._errors import InvalidRequestError

RESERVED_TEMPLATE_KWARGS: Final[frozenset[str]] = frozenset({"add_generation_prompt", "tokenize", "tools"})
"""Template kwargs relaxtrio manages itself; requests may not set them."""

TURN_END_MARKERS: Final[tuple[str, ...]] = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<｜end▁of▁sentence｜>",
    "</s>",
    "<end_of_turn>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|user|>",
    "<|observation|>",
)
"""Strings that end a model turn in common templates; each counts as a stop id when it is an added
token of the tokenizer and occurs in the chat template text."""

_INNER_MARKERS: Final[dict[str, str]] = {"<|end|>": "<|channel|>"}
"""Turn-end markers that only close a message inside a turn in templates holding the given text:
in harmony (gpt-oss) a reply is several messages, each closed by ``<|end|>``, and only
``<|call|>`` / ``<|return|>`` end the generation (docs/model-families.md#gpt-oss)."""

ArgumentsForm = Literal["mapping", "string"]


def reserved_kwargs(tokenizer: Any) -> frozenset[str]:
    """Reserved names plus the parameters ``apply_chat_template`` takes itself (and ``messages``),
    which template kwargs must not shadow."""
    try:
        parameters = inspect.signature(tokenizer.apply_chat_template).parameters.values()
    except (TypeError, ValueError):
        named: set[str] = {"conversation", "chat_template", "documents"}
    else:
        named = {p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return RESERVED_TEMPLATE_KWARGS | named | {"messages"}


def checked_kwargs(template_kwargs: Mapping[str, Any] | None, reserved: frozenset[str]) -> dict[str, Any]:
    """A copy of ``template_kwargs`` with string keys none of which is reserved.

    Raises:
        InvalidRequestError: a non-string or reserved key (param ``chat_template_kwargs[.key]``).
    """
    kwargs = dict(template_kwargs or {})
    for key in kwargs:
        if not isinstance(key, str):
            raise InvalidRequestError(
                f"chat_template_kwargs keys must be strings, got {key!r}", param="chat_template_kwargs"
            )
        if key in reserved:
            raise InvalidRequestError(
                f"chat_template_kwargs cannot set reserved key {key!r}", param=f"chat_template_kwargs.{key}"
            )
    return kwargs


def template_text(tokenizer: Any) -> str:
    """The tokenizer's chat template source; named templates are joined by newlines."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return "\n".join(template.values()) if isinstance(template, Mapping) else str(template)


def reasoning_key(chat_template: str) -> str | None:
    """The message key a template reads reasoning from when it is not ``reasoning_content``.

    gpt-oss's template renders ``message.thinking`` as the analysis channel and never reads
    ``reasoning_content``; canonical messages keep reasoning under ``reasoning_content``, so it is
    copied to ``thinking`` for such a template (docs/model-families.md#gpt-oss).
    """
    if "reasoning_content" not in chat_template and "message.thinking" in chat_template:
        return "thinking"
    return None


def stop_token_ids(tokenizer: Any, extra: Sequence[int]) -> tuple[int, ...]:
    """EOS id(s), end-of-turn markers used by the template, and ``extra``: sorted, unique."""
    ids: set[int] = {int(i) for i in extra}
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, Sequence):
        ids.update(int(i) for i in eos)
    template_text_ = template_text(tokenizer)
    added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    for marker in TURN_END_MARKERS:
        inner = _INNER_MARKERS.get(marker)
        if inner is not None and inner in template_text_:
            continue
        if marker in template_text_ and marker in added:
            ids.add(int(added[marker]))
    return tuple(sorted(ids))


def template_messages(
    messages: Sequence[Mapping[str, Any]], arguments_form: ArgumentsForm, offset: int,
    reasoning_key: str | None = None,
) -> list[dict[str, Any]]:
    """Copies canonical messages into the shape templates expect: tool-call arguments decoded to
    mappings (or kept as canonical strings), empty ``tool_calls`` dropped
    (docs/client-quirks.md#tool-call-arguments-mapping-or-string), and ``reasoning_content``
    also under ``reasoning_key`` when the template reads reasoning there (:func:`reasoning_key`).

    Raises:
        InvalidRequestError: arguments that are not a JSON object, naming
            ``messages[offset + i].tool_calls[j].function.arguments``.
    """
    prepared = []
    for i, message in enumerate(messages):
        copy = dict(message)
        if reasoning_key is not None and copy.get("reasoning_content"):
            copy[reasoning_key] = copy["reasoning_content"]
        calls = copy.get("tool_calls")
        if calls is not None:
            if calls:
                copy["tool_calls"] = [
                    _template_call(call, arguments_form, f"messages[{offset + i}].tool_calls[{j}]")
                    for j, call in enumerate(calls)
                ]
            else:
                del copy["tool_calls"]
        prepared.append(copy)
    return prepared


def _template_call(call: Mapping[str, Any], arguments_form: ArgumentsForm, param: str) -> dict[str, Any]:
    copy = dict(call)
    function = dict(copy.get("function") or {})
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(
                "Assistant tool call function.arguments must be valid JSON.", param=f"{param}.function.arguments"
            ) from exc
    else:
        decoded = arguments
    if not isinstance(decoded, Mapping):
        raise InvalidRequestError(
            "Assistant tool call function.arguments must be a JSON object.", param=f"{param}.function.arguments"
        )
    if arguments_form == "mapping":
        function["arguments"] = dict(decoded)
    elif isinstance(arguments, str):
        function["arguments"] = arguments
    else:
        function["arguments"] = json.dumps(decoded, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    copy["function"] = function
    return copy
