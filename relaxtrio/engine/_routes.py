"""The embedded engine's HTTP views: SGLang's native routes as module-level functions.

Each view reaches the engine it serves through the app (:func:`engine_state` reads
``current_app.extensions[STATE_KEY]``, set by :func:`~relaxtrio.engine.server.create_app`).
:data:`ROUTES` is the route table and :data:`ERROR_HANDLERS` the JSON error pages; the views
only translate HTTP, the scheduler owns the semantics.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio
from quart import Response, current_app, request
from werkzeug.exceptions import HTTPException

from .._errors import InvalidRequestError
from ..media.vision import VisionProcessor
from ..sglang.wire import RequestError, SamplingParams, SchemaError
from ._http_body import (
    BodyError,
    GenerateInput,
    body_field,
    control_body,
    parse_generate_body,
)
from ._info import EngineState, metrics_text, model_info_json, server_info_json
from ._request import Req, build_response
from ._vision_inputs import EngineMedia
from ._weights import WeightLoadError
from .scheduler import PauseMode

__all__ = ["ERROR_HANDLERS", "HEALTH_GENERATE_TIMEOUT_S", "ROUTES", "STATE_KEY", "engine_state"]

logger = logging.getLogger("relaxtrio.engine.server")  # the log lines keep the server's name

HEALTH_GENERATE_TIMEOUT_S: Final = 20.0
STATE_KEY: Final = "relaxtrio.engine"  # app.extensions key of the served EngineState
_PAUSE_MODES: Final = ("abort", "retract", "in_place")

View = Callable[[], Awaitable[Response]]


def engine_state() -> EngineState:
    """The engine state of the app serving the current request (set by ``create_app``)."""
    state: EngineState = current_app.extensions[STATE_KEY]
    return state


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, content_type="application/json")


def _empty(status: int = 200) -> Response:
    return Response(b"", status=status, content_type="text/plain")


def _media_inputs(
    vision: VisionProcessor, input_ids: tuple[int, ...], image_data: tuple[str, ...]
) -> tuple[tuple[int, ...], EngineMedia | None]:
    """Expanded ids and pixels of a request to a VLM (CPU work: run it in a worker thread).

    Raises:
        RequestError: a remote or undecodable image, or a placeholder count that differs from
            the number of images.
    """
    try:
        ids, pixel_values, grid = vision.engine_inputs(input_ids, image_data)
    except InvalidRequestError as exc:
        raise RequestError(exc.message) from exc
    if pixel_values is None or grid is None:
        return ids, None
    return ids, EngineMedia(pixel_values=pixel_values, image_grid_thw=grid)


async def _model_inputs(
    vision: VisionProcessor | None, gen: GenerateInput
) -> tuple[tuple[int, ...], EngineMedia | None]:
    """The ids the model runs on and the request's pixels (images are decoded in a thread).

    Raises:
        RequestError: ``image_data`` sent to a text-only model, or as :func:`_media_inputs`.

    Cancellation:
        A checkpoint only when there are images to decode; nothing is kept.
    """
    if vision is None:
        if gen.image_data:
            raise RequestError(
                "image_data is not supported: the served model is text-only (no vision encoder)."
            )
        return gen.input_ids, None
    if gen.image_data:
        return await trio.to_thread.run_sync(_media_inputs, vision, gen.input_ids, gen.image_data)
    return _media_inputs(vision, gen.input_ids, ())


def _generate_reply(state: EngineState, gen: GenerateInput, req: Req) -> Response:
    """The ``/generate`` answer of a finished request: its body, or the error it failed with."""
    reason = req.finish_reason or {}
    if reason.get("status_code") is not None:  # a failed request is an HTTP error, as in SGLang
        status = int(reason["status_code"])
        return _json({"object": "error", "message": reason.get("message", ""),
                      "type": str(status), "param": None, "code": status}, status)
    scheduler = state.scheduler
    body = build_response(req, scheduler.tokenizer, current_weight_version=scheduler.weight_version)
    if gen.return_prompt_token_ids:
        body["prompt_token_ids"] = list(gen.input_ids)
    return _json(body)


async def _generate() -> Response:
    """``POST /generate``: run one request to completion (or abort) and answer its output."""
    state = engine_state()
    scheduler = state.scheduler
    raw = await request.get_data()
    try:
        gen = parse_generate_body(raw, scheduler.tokenizer.encode)
        input_ids, media = await _model_inputs(state.vision, gen)
        if gen.session_id is not None:
            state.open_sessions.add(gen.session_id)
        req = await scheduler.generate(
            input_ids,
            gen.sampling_params,
            rid=gen.rid,
            return_logprob=gen.return_logprob,
            top_logprobs_num=gen.top_logprobs_num,
            return_text_in_logprobs=gen.return_text_in_logprobs,
            media=media,
        )
    except SchemaError as exc:
        return _json(exc.to_json(), 400)
    except RequestError as exc:
        return _json(exc.to_json(), exc.status)
    return _generate_reply(state, gen, req)


# ---------------------------------------------------------------- control routes (JSON body)
_ControlFn = Callable[[EngineState, dict[str, Any]], Awaitable[Response]]


def _control(fn: _ControlFn) -> View:
    """A view that reads the JSON object body, calls ``fn(state, body)``, and answers a
    :class:`BodyError` (missing body, wrong field type) with its 400."""

    async def view() -> Response:
        try:
            body = control_body(await request.get_data())
            return await fn(engine_state(), body)
        except BodyError as exc:
            return _json(exc.to_json(), exc.status)

    view.__name__ = fn.__name__
    return view


async def _abort_request(state: EngineState, body: dict[str, Any]) -> Response:
    if body_field(body, "abort_all", bool, default=False):
        state.scheduler.abort_all()
    else:
        rid = body_field(body, "rid", str, default="")
        if rid:
            state.scheduler.abort(rid)
    return _empty()


async def _pause_generation(state: EngineState, body: dict[str, Any]) -> Response:
    mode = body_field(body, "mode", str, default="abort")
    if mode not in _PAUSE_MODES:
        raise BodyError(f"1 validation error:\n  mode must be one of {list(_PAUSE_MODES)}")
    await state.scheduler.pause(_pause_mode(mode))
    return _json({"message": "Generation paused successfully.", "status": "ok"})


async def _continue_generation(state: EngineState, body: dict[str, Any]) -> Response:
    state.scheduler.resume()
    return _json({"message": "Generation continued successfully.", "status": "ok"})


async def _update_weights_from_disk(state: EngineState, body: dict[str, Any]) -> Response:
    model_path = body_field(body, "model_path", str, required=True)
    version = body_field(body, "weight_version", str)
    abort_all = body_field(body, "abort_all_requests", bool, default=False)
    body_field(body, "flush_cache", bool, default=True)  # the prefix cache is always flushed
    try:
        await state.scheduler.update_weights_from_disk(
            model_path, weight_version=version, abort_all=abort_all
        )
    except WeightLoadError as exc:
        message = f"Failed to update weights: {exc}"
        return _json({"success": False, "message": message, "num_paused_requests": 0}, 400)
    state.model_path = model_path
    message = "Succeeded to update model weights."
    if version is not None:
        message += f" Weight version updated to {version}."
    return _json({"success": True, "message": message, "num_paused_requests": 0})


async def _update_weight_version(state: EngineState, body: dict[str, Any]) -> Response:
    new_version = body_field(body, "new_version", str, required=True)
    abort_all = body_field(body, "abort_all_requests", bool, default=True)
    state.scheduler.set_weight_version(new_version, abort_all=abort_all)
    return _json(
        {
            "success": True,
            "message": f"Weight version updated to {new_version}",
            "new_version": new_version,
        }
    )


async def _close_session(state: EngineState, body: dict[str, Any]) -> Response:
    state.open_sessions.discard(body_field(body, "session_id", str, default=""))
    return _empty()


def _pause_mode(mode: str) -> PauseMode:
    if mode == "retract":
        return "retract"
    if mode == "in_place":
        return "in_place"
    return "abort"


# ---------------------------------------------------------------- health and info routes
async def _health() -> Response:
    return _empty(200)


async def _health_generate() -> Response:
    params = SamplingParams(max_new_tokens=1, temperature=0.0)
    with trio.move_on_after(HEALTH_GENERATE_TIMEOUT_S):
        await engine_state().scheduler.generate([0], params, rid=f"HEALTH_CHECK_{uuid.uuid4().hex}")
        return _empty(200)
    return _empty(503)


async def _ready() -> Response:
    return _empty(503 if engine_state().scheduler.paused else 200)


async def _model_info() -> Response:
    return _json(model_info_json(engine_state()))


async def _server_info() -> Response:
    return _json(server_info_json(engine_state()))


async def _models() -> Response:
    state = engine_state()
    card = {
        "id": state.model_path,
        "object": "model",
        "created": int(state.started_at),
        "owned_by": "relaxtrio",
        "root": state.model_path,
        "max_model_len": state.scheduler.limits.context_length,
    }
    return _json({"object": "list", "data": [card]})


async def _flush_cache() -> Response:
    engine_state().scheduler.flush_cache()
    return Response("Cache flushed.\n", status=200, content_type="text/plain")


async def _metrics() -> Response:
    return Response(metrics_text(engine_state()), status=200, content_type="text/plain; version=0.0.4")


# ---------------------------------------------------------------- errors
async def _http_error(exc: HTTPException) -> Response:
    status = exc.code or 500
    return _json(
        {"object": "error", "message": exc.description or exc.name, "type": exc.name,
         "param": None, "code": status},
        status,
    )


async def _unexpected_error(exc: Exception) -> Response:
    logger.exception("unexpected error in the embedded engine", exc_info=exc)
    return _json(
        {"object": "error", "message": "Internal server error", "type": "InternalServerError",
         "param": None, "code": 500},
        500,
    )


_GET: Final = ("GET",)
_POST: Final = ("POST",)
# (path, endpoint, view, methods): every route of the engine.
ROUTES: Final[tuple[tuple[str, str, View, tuple[str, ...]], ...]] = (
    ("/generate", "generate", _generate, ("POST", "PUT")),
    ("/abort_request", "abort_request", _control(_abort_request), _POST),
    ("/pause_generation", "pause_generation", _control(_pause_generation), _POST),
    ("/continue_generation", "continue_generation", _control(_continue_generation), _POST),
    ("/update_weights_from_disk", "update_weights_from_disk", _control(_update_weights_from_disk), _POST),
    ("/update_weight_version", "update_weight_version", _control(_update_weight_version), _POST),
    ("/close_session", "close_session", _control(_close_session), _POST),
    ("/health", "health", _health, _GET),
    ("/health_generate", "health_generate", _health_generate, _GET),
    ("/ready", "ready", _ready, _GET),
    ("/model_info", "model_info", _model_info, _GET),
    ("/get_model_info", "get_model_info", _model_info, _GET),
    ("/server_info", "server_info", _server_info, _GET),
    ("/get_server_info", "get_server_info", _server_info, _GET),
    ("/v1/models", "models", _models, _GET),
    ("/flush_cache", "flush_cache", _flush_cache, ("GET", "POST")),
    ("/metrics", "metrics", _metrics, _GET),
)

ERROR_HANDLERS: Final = ((HTTPException, _http_error), (Exception, _unexpected_error))
