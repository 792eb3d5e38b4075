"""Token limits of the embedded engine and SGLang 0.5.23's length checks.

The checks run in SGLang's order and use its exact texts, because clients classify them by
substring (docs/client-quirks.md#context-length-error-texts):

1. tokenizer stage: ``prompt >= context`` → ``The input (N tokens) is longer than …``; an explicit
   ``max_new_tokens`` with ``prompt + max_new_tokens >= context`` → ``Requested token count
   exceeds …``;
2. scheduler stage: ``prompt >= max_req_input_len`` → ``Input length (N tokens) exceeds the maximum
   allowed length …``;
3. then ``max_new_tokens`` (default 128) is **silently clamped** to ``max_req_len - prompt - 1``
   and the clamped value is what ``finish_reason.length`` reports
   (docs/client-quirks.md#silent-clamp-of-max_new_tokens).
"""

from __future__ import annotations

from typing import Final

import attrs

from ..sglang.wire import RequestError

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "EngineLimits", "resolve_max_new_tokens"]

DEFAULT_MAX_NEW_TOKENS: Final = 128
_REQ_LEN_MARGIN: Final = 1  # SGLang: max_req_len = context_len - 1
_INPUT_LEN_MARGIN: Final = 5  # SGLang: max_req_input_len = max_req_len - 5


@attrs.frozen(kw_only=True)
class EngineLimits:
    """Token limits of one engine, derived from the context window the way SGLang does.

    Attributes:
        context_length: model window in tokens.
        max_running_requests: rows decoded together.
    """

    context_length: int
    max_running_requests: int

    @property
    def max_req_len(self) -> int:
        """Tokens one request may hold in total (prompt + output) plus one."""
        return self.context_length - _REQ_LEN_MARGIN

    @property
    def max_req_input_len(self) -> int:
        """Prompts of this many tokens or more are refused."""
        return self.max_req_len - _INPUT_LEN_MARGIN

    @property
    def max_total_num_tokens(self) -> int:
        """Token capacity we advertise for the (dynamic) KV cache: every row at full length."""
        return self.context_length * self.max_running_requests


def check_prompt_fits(limits: EngineLimits, num_input: int, max_new_tokens: int | None) -> None:
    """Tokenizer-stage checks (step 1 of the module docstring).

    Raises:
        RequestError: with SGLang's text.
    """
    context = limits.context_length
    if num_input >= context:
        raise RequestError(
            f"The input ({num_input} tokens) is longer than the model's context length "
            f"({context} tokens)."
        )
    if max_new_tokens is not None and max_new_tokens + num_input >= context:
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of {context} "
            f"tokens. You requested a total of {max_new_tokens + num_input} tokens: {num_input} "
            f"tokens from the input messages and {max_new_tokens} tokens for the completion. "
            "Please reduce the number of tokens in the input messages or the completion to fit "
            "within the limit."
        )


def resolve_max_new_tokens(limits: EngineLimits, num_input: int, max_new_tokens: int | None) -> int:
    """Scheduler-stage check and the silent clamp (steps 2 and 3); returns the token budget.

    Raises:
        RequestError: the prompt exceeds ``max_req_input_len``.
    """
    if num_input >= limits.max_req_input_len:
        raise RequestError(
            f"Input length ({num_input} tokens) exceeds the maximum allowed length "
            f"({limits.max_req_input_len} tokens). Use a shorter input or enable "
            "--allow-auto-truncate."
        )
    requested = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens
    return min(requested, limits.max_req_len - num_input - 1)
