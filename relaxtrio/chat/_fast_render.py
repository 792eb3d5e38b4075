"""What ``apply_chat_template(tokenize=False)`` and ``encode(add_special_tokens=False)`` compute,
without transformers' per-call input handling.

For a one-message observation, transformers spends more time normalizing its inputs (converting
message objects, deep copies for the sandbox, batching, padding and truncation set-up) than
rendering and tokenizing them. Canonical messages are already plain JSON data, so both steps can
call the compiled template and the Rust tokenizer directly:

* :class:`TemplateRenderer` renders with the same compiled template transformers uses (its own
  cache, so the same Jinja environment, globals and filters), the same variables (the special
  tokens map under the request's kwargs, ``documents=None``) and the same message preparation
  (``None``-valued keys dropped, reasoning aliased under ``thinking``). The template runs in an
  immutable sandbox, so it cannot change the caller's messages and no copy is needed.
* :func:`fast_encode` calls the tokenizer's Rust backend when no padding, truncation or
  special-token splitting is configured on it, which is exactly when transformers' ``encode``
  passes the text through unchanged.
* :func:`fast_decode` calls the Rust backend's ``decode`` when the tokenizer is transformers'
  own fast tokenizer class (no subclass changes ``decode``); with
  ``clean_up_tokenization_spaces=False`` that is all transformers' ``decode`` does.

Either falls back to transformers' own call when the tokenizer is not a transformers fast
tokenizer (or a future transformers lacks the pieces); ``tests/chat`` compares both paths on
every bundled and test template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["TemplateRenderer", "fast_decode", "fast_encode", "plain_backend"]

try:  # private helpers of transformers 5 (pinned); without them every call falls back
    from transformers.utils.chat_template_utils import (
        _alias_reasoning_fields,
        _compile_jinja_template,
    )
except ImportError:  # pragma: no cover - depends on the installed transformers
    _compile_jinja_template = None
    _alias_reasoning_fields = None
try:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    from transformers.tokenization_utils_tokenizers import TokenizersBackend
except ImportError:  # pragma: no cover - depends on the installed transformers
    PreTrainedTokenizerBase = TokenizersBackend = None


class TemplateRenderer:
    """Renders a tokenizer's chat template like ``apply_chat_template(..., tokenize=False)``.

    Args:
        tokenizer: a transformers tokenizer with a chat template.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._compiled: dict[bool, Any] = {}  # has tools -> compiled template
        special = getattr(tokenizer, "special_tokens_map", None)
        self._special: dict[str, Any] | None = (
            dict(special) if isinstance(special, Mapping) and _compile_jinja_template is not None
            and hasattr(tokenizer, "get_chat_template") else None
        )

    def _template(self, has_tools: bool) -> Any:
        compiled = self._compiled.get(has_tools)
        if compiled is None:
            source = self._tokenizer.get_chat_template(None, [] if has_tools else None)
            compiled = self._compiled[has_tools] = _compile_jinja_template(source)
        return compiled

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        kwargs: Mapping[str, Any],
    ) -> Any:
        """The rendered text (whatever the template returns; callers check it is a ``str``).

        Args:
            messages: plain-JSON messages (not changed).
            tools: tool schemas, or None.
            add_generation_prompt: append the assistant header.
            kwargs: extra template variables (plain JSON), over the special tokens map.

        Raises:
            jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError: as
                ``apply_chat_template`` raises them for the same inputs.
        """
        if not messages:
            raise ValueError("Cannot apply chat template to an empty conversation.")
        if self._special is None:
            return self._tokenizer.apply_chat_template(
                [dict(m) for m in messages], tools=tools, tokenize=False,
                add_generation_prompt=add_generation_prompt, **kwargs,
            )
        chat = _alias_reasoning_fields(
            [{k: v for k, v in m.items() if v is not None} for m in messages]
        )
        variables = {**self._special, **kwargs}
        return self._template(tools is not None).render(
            messages=chat, tools=tools, documents=None,
            add_generation_prompt=add_generation_prompt, **variables,
        )


def plain_backend(tokenizer: Any) -> Any:
    """The tokenizer's Rust backend when ``encode(text, add_special_tokens=False)`` passes the
    text to it unchanged (no padding, truncation or special-token splitting), else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (
        backend is not None
        and not getattr(tokenizer, "split_special_tokens", True)
        and backend.truncation is None
        and backend.padding is None
        and not backend.encode_special_tokens
    ):
        return backend
    return None


def fast_encode(tokenizer: Any, text: str) -> list[int]:
    """``tokenizer.encode(text, add_special_tokens=False)``, through the Rust backend when that
    is the same computation (:func:`plain_backend`).

    Args:
        tokenizer: a transformers tokenizer.
        text: the text to tokenize.

    Returns:
        The token ids.
    """
    backend = plain_backend(tokenizer)
    if backend is not None:
        return backend.encode(text, add_special_tokens=False).ids
    return tokenizer.encode(text, add_special_tokens=False)


def fast_decode(tokenizer: Any, token_ids: list[int]) -> str:
    """``tokenizer.decode(token_ids, skip_special_tokens=False,
    clean_up_tokenization_spaces=False)``, through the Rust backend when that is the same
    computation (a :class:`TokenizersBackend` whose class keeps transformers' ``decode``).

    Args:
        tokenizer: a transformers tokenizer.
        token_ids: the ids (a list of ints).

    Returns:
        The text, special tokens kept, no whitespace clean-up.
    """
    cls = type(tokenizer)
    if (
        TokenizersBackend is not None
        and isinstance(tokenizer, TokenizersBackend)
        and cls.decode is PreTrainedTokenizerBase.decode
        and cls._decode is TokenizersBackend._decode
    ):
        return tokenizer.backend_tokenizer.decode(token_ids, skip_special_tokens=False)
    return tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
