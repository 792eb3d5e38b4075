"""Request-body parsing of the embedded engine's HTTP routes (SGLang 0.5.23 field names).

``/generate``: single form only, non-streaming; unknown top-level keys are ignored; features the CPU
engine lacks (batch form, streaming, prompt logprobs, video/audio, LoRA, ``session_params``) are
refused with a 400 that says so rather than silently ignored. ``image_data`` (one image or a list,
each a ``data:`` URL, bare base64 or ``{"url": ...}``) is parsed here; whether the served model can
take it is the server's check. Control routes need a JSON object body; an empty body is the
FastAPI-style 400 (docs/client-quirks.md#three-error-envelopes). Every body must be UTF-8 JSON, as
for the agent API (:func:`~relaxtrio._validate.loads_utf8_json`): a UTF-16 one is refused as "not
valid UTF-8 JSON" where SGLang's FastAPI would guess its encoding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import attrs

from .._validate import is_int, loads_utf8_json
from ..sglang.wire import (
    RequestError,
    SamplingParams,
    SchemaError,
    parse_sampling_params,
)

__all__ = [
    "BodyError",
    "GenerateInput",
    "control_body",
    "parse_generate_body",
]

_UNSUPPORTED_TOP_LEVEL: Final = (
    "input_embeds",
    "video_data",
    "audio_data",
    "lora_path",
    "session_params",
    "token_ids_logprob",
    "custom_logit_processor",
)


class BodyError(Exception):
    """FastAPI-style validation failure: HTTP 400 ``{"object": "error", ...}``.

    The third envelope of docs/client-quirks.md#three-error-envelopes.
    """

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message = message
        self.status = status

    def to_json(self) -> dict[str, Any]:
        return {
            "object": "error",
            "message": self.message,
            "type": "Bad Request",
            "param": None,
            "code": self.status,
        }


@attrs.frozen(kw_only=True)
class GenerateInput:
    """A validated single-form ``/generate`` request."""

    input_ids: tuple[int, ...]
    sampling_params: SamplingParams
    rid: str | None
    return_logprob: bool
    top_logprobs_num: int
    return_text_in_logprobs: bool
    return_prompt_token_ids: bool
    image_data: tuple[str, ...] = ()
    session_id: str | None = None


def _field(body: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if kind is int and not is_int(value):
        raise SchemaError(f"invalid type for field `{key}`: expected an integer")
    if kind is not int and not isinstance(value, kind):
        raise SchemaError(f"invalid type for field `{key}`: expected {kind.__name__}")
    return value


def _image_data(value: Any) -> tuple[str, ...]:
    """``image_data`` as a tuple of strings (None → empty)."""
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if any(isinstance(item, list) for item in items):
        raise RequestError("A list of image_data lists (batch form) is not supported by the relaxtrio "
                           "embedded engine.")
    out = []
    for i, item in enumerate(items):
        if isinstance(item, dict):
            item = item.get("url")
        if not isinstance(item, str) or not item:
            raise SchemaError(f"invalid type for field `image_data[{i}]`: expected a non-empty string "
                              "or an object with a `url` string")
        out.append(item)
    return tuple(out)


def parse_generate_body(raw: bytes, encode: Callable[[str], list[int]]) -> GenerateInput:
    """Validate a ``/generate`` body.

    Args:
        raw: the request body bytes.
        encode: tokenizes ``text`` prompts with the server's tokenizer.

    Raises:
        SchemaError: not UTF-8 JSON (a UTF-16 or otherwise non-UTF-8 body included), not a JSON
            object, or a field of the wrong JSON type / unknown sampling key.
        RequestError: missing or empty input, or a feature the embedded engine does not offer.
    """
    try:
        body = loads_utf8_json(raw) if raw else None
    except ValueError as exc:  # not UTF-8 (e.g. UTF-16), or not JSON
        raise SchemaError(f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise SchemaError("invalid type: expected struct GenerateReqInput (a JSON object)")
    for key in _UNSUPPORTED_TOP_LEVEL:
        if body.get(key) is not None:
            raise RequestError(f"{key} is not supported by the relaxtrio embedded engine.")
    if body.get("stream"):
        raise RequestError("stream=true is not supported by the relaxtrio embedded engine.")
    text, input_ids = body.get("text"), body.get("input_ids")
    if text is not None and input_ids is not None:
        raise RequestError("Either text or input_ids should be provided, not both.")
    if text is None and input_ids is None:
        raise RequestError("Either text, input_ids or input_embeds should be provided.")
    if input_ids is not None:
        if not isinstance(input_ids, list):
            raise SchemaError("invalid type for field `input_ids`: expected a sequence")
        if input_ids and all(isinstance(x, list) for x in input_ids):
            raise RequestError("The batch form of /generate is not supported by the relaxtrio "
                               "embedded engine; send one request per prompt.")
        if not all(is_int(x) for x in input_ids):
            raise SchemaError("invalid type for field `input_ids`: expected integers")
        ids = tuple(input_ids)
    else:
        if isinstance(text, list):
            raise RequestError("The batch form of /generate is not supported by the relaxtrio "
                               "embedded engine; send one request per prompt.")
        if not isinstance(text, str):
            raise SchemaError("invalid type for field `text`: expected a string")
        ids = tuple(encode(text))
    if not ids:
        raise RequestError("input_ids cannot be empty.")
    if isinstance(body.get("sampling_params"), list):
        raise RequestError("A list of sampling_params (batch form) is not supported by the "
                           "relaxtrio embedded engine.")
    params = parse_sampling_params(body.get("sampling_params"))
    return_logprob = _field(body, "return_logprob", bool, False)
    logprob_start_len = _field(body, "logprob_start_len", int, -1)
    if return_logprob and logprob_start_len != -1:
        raise RequestError("logprob_start_len >= 0 (prompt logprobs) is not supported by the "
                           "relaxtrio embedded engine; use -1.")
    top_logprobs_num = _field(body, "top_logprobs_num", int, 0)
    if top_logprobs_num < 0:
        raise RequestError(f"top_logprobs_num must be at least 0, got {top_logprobs_num}.")
    rid = _field(body, "rid", str, None)
    return GenerateInput(
        input_ids=ids,
        sampling_params=params,
        rid=rid,
        return_logprob=return_logprob,
        top_logprobs_num=top_logprobs_num if return_logprob else 0,
        return_text_in_logprobs=_field(body, "return_text_in_logprobs", bool, False),
        return_prompt_token_ids=_field(body, "return_prompt_token_ids", bool, False),
        image_data=_image_data(body.get("image_data")),
        session_id=_field(body, "session_id", str, None),
    )


def control_body(raw: bytes) -> dict[str, Any]:
    """Decode the required JSON object body of a control route.

    Raises:
        BodyError: empty body (``Field required``), invalid JSON (not UTF-8 included), or not an
            object.
    """
    if not raw.strip():
        raise BodyError(
            "1 validation error:\n  {'type': 'missing', 'loc': ('body',), 'msg': 'Field required',"
            " 'input': None}"
        )
    try:
        body = loads_utf8_json(raw)
    except ValueError as exc:  # not UTF-8 (e.g. UTF-16), or not JSON
        raise BodyError(f"1 validation error:\n  JSON decode error: {exc}") from exc
    if not isinstance(body, dict):
        raise BodyError("1 validation error:\n  body must be a JSON object")
    return body


def body_field(body: dict[str, Any], key: str, kind: type, *, required: bool = False,
               default: Any = None) -> Any:
    """One typed field of a control body (missing / null gives ``default``).

    Raises:
        BodyError: a required field is missing or a field has the wrong JSON type.
    """
    value = body.get(key)
    if value is None:
        if required:
            raise BodyError(f"1 validation error:\n  {{'type': 'missing', 'loc': ('body', "
                            f"'{key}'), 'msg': 'Field required'}}")
        return default
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise BodyError(f"1 validation error:\n  field '{key}' must be of type {kind.__name__}")
    return value
