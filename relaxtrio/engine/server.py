"""The embedded CPU engine's HTTP server: SGLang's native API on quart-trio / hypercorn.

Routes (sglang-native-api.md §8 items 1-6): ``/generate``, ``/abort_request``,
``/pause_generation``, ``/continue_generation``, ``/update_weights_from_disk``,
``/update_weight_version``, ``/health``, ``/health_generate``, ``/ready``, ``/model_info`` (+
``/get_model_info``), ``/server_info`` (+ ``/get_server_info``), ``/v1/models``, ``/flush_cache``,
``/close_session`` and ``/metrics``. Batching and request semantics live in
:mod:`relaxtrio.engine.scheduler`; this module only translates HTTP.

Start it with :func:`serve_engine` (``await nursery.start(serve_engine, config)`` returns the base
URL) or from the command line (``python -m relaxtrio.engine``).

Images: when the model directory is a vision-language model (Qwen2-VL family), ``/generate``
takes ``image_data`` as SGLang does: ``input_ids`` hold one image placeholder per image, the
engine decodes the images (``data:`` URLs or bare base64; remote URLs are refused with a 400, the
engine does not fetch), runs the image processor, expands each placeholder to the image's feature
count and prefills with the vision tower. ``meta_info.prompt_tokens`` counts the expanded ids,
and so do the context checks. A text-only model refuses ``image_data`` with a 400.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, Literal

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from .._errors import InvalidRequestError
from ..media.vision import VisionProcessor
from ..models import eos_token_ids, load_model, load_tokenizer
from ..sglang.wire import RequestError, SamplingParams, SchemaError
from ._http_body import BodyError, body_field, control_body, parse_generate_body
from ._info import EngineState, metrics_text, model_info_json, server_info_json
from ._request import build_response
from ._vision_inputs import EngineMedia
from ._weights import WeightLoadError
from .scheduler import EngineLimits, PauseMode, Scheduler

__all__ = ["EngineConfig", "create_app", "serve_engine"]

logger = logging.getLogger(__name__)

HEALTH_GENERATE_TIMEOUT_S: Final = 20.0
_MAX_BODY_BYTES: Final = 256 * 1024 * 1024
_PAUSE_MODES: Final = ("abort", "retract", "in_place")


@attrs.frozen(kw_only=True)
class EngineConfig:
    """Settings of one embedded engine process (the CLI flags of ``python -m relaxtrio.engine``).

    Attributes:
        model_path: HF model directory (``ensure_smollm2()`` / ``build_tiny_model()`` output).
        host: bind address.
        port: bind port; 0 picks a free one.
        max_running_requests: rows decoded together; more requests wait in a queue.
        context_length: window in tokens; default ``max_position_embeddings`` of the model.
        weight_version: initial weight version label.
        dtype: parameter dtype name (``float32`` keeps logprobs consistent with training).
        graceful_timeout_s: seconds open connections get to finish at shutdown.
    """

    model_path: Path = attrs.field(converter=Path)
    host: str = "127.0.0.1"
    port: int = 0
    max_running_requests: int = 16
    context_length: int | None = None
    weight_version: str = "default"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    graceful_timeout_s: float = 2.0


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


def create_app(state: EngineState) -> QuartTrio:
    """Build the quart-trio app serving one engine's scheduler."""
    app = QuartTrio(__name__)
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = None
    app.config["MAX_CONTENT_LENGTH"] = _MAX_BODY_BYTES
    scheduler = state.scheduler

    def control(fn: Callable[[dict[str, Any]], Awaitable[Response]]) -> Callable[[], Awaitable[Response]]:
        async def handler() -> Response:
            try:
                body = control_body(await request.get_data())
                return await fn(body)
            except BodyError as exc:
                return _json(exc.to_json(), exc.status)

        handler.__name__ = fn.__name__
        return handler

    @app.route("/generate", methods=["POST", "PUT"])
    async def generate() -> Response:
        raw = await request.get_data()
        try:
            gen = parse_generate_body(raw, lambda text: scheduler.tokenizer.encode(text))
            input_ids, media = gen.input_ids, None
            if state.vision is None and gen.image_data:
                raise RequestError(
                    "image_data is not supported: the served model is text-only (no vision encoder)."
                )
            if state.vision is not None and gen.image_data:
                input_ids, media = await trio.to_thread.run_sync(
                    _media_inputs, state.vision, gen.input_ids, gen.image_data
                )
            elif state.vision is not None:
                input_ids, media = _media_inputs(state.vision, gen.input_ids, ())
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
        reason = req.finish_reason or {}
        if reason.get("status_code") is not None:  # a failed request is an HTTP error (§2.5)
            status = int(reason["status_code"])
            return _json({"object": "error", "message": reason.get("message", ""),
                          "type": str(status), "param": None, "code": status}, status)
        body = build_response(
            req, scheduler.tokenizer, current_weight_version=scheduler.weight_version
        )
        if gen.return_prompt_token_ids:
            body["prompt_token_ids"] = list(gen.input_ids)
        return _json(body)

    async def abort_request(body: dict[str, Any]) -> Response:
        if body_field(body, "abort_all", bool, default=False):
            scheduler.abort_all()
        else:
            rid = body_field(body, "rid", str, default="")
            if rid:
                scheduler.abort(rid)
        return _empty()

    async def pause_generation(body: dict[str, Any]) -> Response:
        mode = body_field(body, "mode", str, default="abort")
        if mode not in _PAUSE_MODES:
            raise BodyError(f"1 validation error:\n  mode must be one of {list(_PAUSE_MODES)}")
        await scheduler.pause(_pause_mode(mode))
        return _json({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(body: dict[str, Any]) -> Response:
        scheduler.resume()
        return _json({"message": "Generation continued successfully.", "status": "ok"})

    async def update_weights_from_disk(body: dict[str, Any]) -> Response:
        model_path = body_field(body, "model_path", str, required=True)
        version = body_field(body, "weight_version", str)
        abort_all = body_field(body, "abort_all_requests", bool, default=False)
        body_field(body, "flush_cache", bool, default=True)  # no prefix cache: nothing to flush
        try:
            await scheduler.update_weights_from_disk(
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

    async def update_weight_version(body: dict[str, Any]) -> Response:
        new_version = body_field(body, "new_version", str, required=True)
        abort_all = body_field(body, "abort_all_requests", bool, default=True)
        scheduler.set_weight_version(new_version, abort_all=abort_all)
        return _json(
            {
                "success": True,
                "message": f"Weight version updated to {new_version}",
                "new_version": new_version,
            }
        )

    async def close_session(body: dict[str, Any]) -> Response:
        return _empty()

    for route, fn in (
        ("/abort_request", abort_request),
        ("/pause_generation", pause_generation),
        ("/continue_generation", continue_generation),
        ("/update_weights_from_disk", update_weights_from_disk),
        ("/update_weight_version", update_weight_version),
        ("/close_session", close_session),
    ):
        app.add_url_rule(route, fn.__name__, control(fn), methods=["POST"])

    @app.route("/health")
    async def health() -> Response:
        return _empty(200)

    @app.route("/health_generate")
    async def health_generate() -> Response:
        params = SamplingParams(max_new_tokens=1, temperature=0.0)
        with trio.move_on_after(HEALTH_GENERATE_TIMEOUT_S):
            await scheduler.generate([0], params, rid=f"HEALTH_CHECK_{uuid.uuid4().hex}")
            return _empty(200)
        return _empty(503)

    @app.route("/ready")
    async def ready() -> Response:
        return _empty(503 if scheduler.paused else 200)

    @app.route("/model_info")
    @app.route("/get_model_info", endpoint="get_model_info")
    async def model_info() -> Response:
        return _json(model_info_json(state))

    @app.route("/server_info")
    @app.route("/get_server_info", endpoint="get_server_info")
    async def server_info() -> Response:
        return _json(server_info_json(state))

    @app.route("/v1/models")
    async def models() -> Response:
        card = {
            "id": state.model_path,
            "object": "model",
            "created": int(state.started_at),
            "owned_by": "relaxtrio",
            "root": state.model_path,
            "max_model_len": scheduler.limits.context_length,
        }
        return _json({"object": "list", "data": [card]})

    @app.route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        # No prefix cache exists in the embedded engine, so there is never anything to flush.
        return Response("Cache flushed.\n", status=200, content_type="text/plain")

    @app.route("/metrics")
    async def metrics() -> Response:
        return Response(metrics_text(state), status=200, content_type="text/plain; version=0.0.4")

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        return _json(
            {"object": "error", "message": exc.description or exc.name, "type": exc.name,
             "param": None, "code": status},
            status,
        )

    @app.errorhandler(Exception)
    async def unexpected_error(exc: Exception) -> Response:
        logger.exception("unexpected error in the embedded engine", exc_info=exc)
        return _json(
            {"object": "error", "message": "Internal server error", "type": "InternalServerError",
             "param": None, "code": 500},
            500,
        )

    return app


def _pause_mode(mode: str) -> PauseMode:
    if mode == "retract":
        return "retract"
    if mode == "in_place":
        return "in_place"
    return "abort"


async def _load(config: EngineConfig) -> EngineState:
    import torch

    dtype = getattr(torch, config.dtype)
    model = await trio.to_thread.run_sync(load_model, config.model_path, dtype)
    tokenizer = await trio.to_thread.run_sync(load_tokenizer, config.model_path)
    context = config.context_length or int(model.config.get_text_config().max_position_embeddings)
    vision = await trio.to_thread.run_sync(VisionProcessor.for_engine, config.model_path)
    eos = eos_token_ids(config.model_path)
    if tokenizer.eos_token_id is not None:
        eos |= {int(tokenizer.eos_token_id)}
    scheduler = Scheduler(
        model,
        tokenizer,
        limits=EngineLimits(
            context_length=context, max_running_requests=config.max_running_requests
        ),
        eos_ids=frozenset(eos),
        weight_version=config.weight_version,
    )
    return EngineState(
        scheduler=scheduler,
        model_path=str(config.model_path),
        tokenizer_path=str(config.model_path),
        dtype=config.dtype,
        started_at=time.time(),
        model_type=str(model.config.model_type),
        architectures=list(model.config.architectures or []),
        vision=vision,
    )


async def serve_engine(
    config: EngineConfig,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Load the model and serve the engine until cancelled or ``shutdown_trigger`` returns.

    Args:
        config: engine settings.
        shutdown_trigger: optional awaitable factory; when it returns, in-flight requests are
            aborted (their callers get partial output), open connections get
            ``config.graceful_timeout_s`` seconds, and the function returns.
        task_status: receives the base URL, e.g. ``http://127.0.0.1:41234``, once listening.

    Cancellation:
        Cancelling stops serving at once; a model step in flight finishes in its thread first.
    """
    state = await _load(config)
    app = create_app(state)
    hyper = HypercornConfig()
    hyper.bind = [f"{config.host}:{config.port}"]
    hyper.graceful_timeout = config.graceful_timeout_s
    hyper.accesslog = None
    hyper.errorlog = logger

    async def stop_trigger() -> None:
        if shutdown_trigger is None:
            await trio.sleep_forever()
        else:
            await shutdown_trigger()
        state.scheduler.abort_all()

    async with trio.open_nursery() as nursery:
        await nursery.start(state.scheduler.run)

        async def run_http(*, task_status: trio.TaskStatus[list[str]]) -> None:
            await serve(app, hyper, shutdown_trigger=stop_trigger, task_status=task_status)
            nursery.cancel_scope.cancel()  # HTTP has shut down: stop the scheduler loop too

        binds = await nursery.start(run_http)
        task_status.started(binds[0])
