"""The embedded CPU engine's HTTP server: SGLang's native API on quart-trio / hypercorn.

Routes (the part of SGLang's native API that relaxtrio's client uses,
https://docs.sglang.io/basic_usage/native_api.html): ``/generate``, ``/abort_request``,
``/pause_generation``, ``/continue_generation``, ``/update_weights_from_disk``,
``/update_weight_version``, ``/health``, ``/health_generate``, ``/ready``, ``/model_info`` (+
``/get_model_info``), ``/server_info`` (+ ``/get_server_info``), ``/v1/models``, ``/flush_cache``,
``/close_session`` and ``/metrics``. Batching and request semantics live in
:mod:`relaxtrio.engine.scheduler`, the views in :mod:`relaxtrio.engine._routes`; this module
builds the app, loads the model and serves.

Start it with :func:`serve_engine` (``await nursery.start(serve_engine, config)`` returns the base
URL) or from the command line (``python -m relaxtrio.engine``). :func:`load_engine` plus
:func:`serve_engine_state` do the same in two steps, so a caller (a test) keeps the
:class:`EngineState` and can wait on its scheduler's events.

Images: when the model directory is a vision-language model (Qwen2-VL family), ``/generate``
takes ``image_data`` as SGLang does: ``input_ids`` hold one image placeholder per image, the
engine decodes the images (``data:`` URLs or bare base64; remote URLs are refused with a 400, the
engine does not fetch), runs the image processor, expands each placeholder to the image's feature
count and prefills with the vision tower. ``meta_info.prompt_tokens`` counts the expanded ids,
and so do the context checks. A text-only model refuses ``image_data`` with a 400.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, Literal

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from quart_trio import QuartTrio

from .._serving import LISTEN_BACKLOG, serve_isolated
from ..media.vision import VisionProcessor
from ..models import eos_token_ids, load_model, load_tokenizer
from ._info import EngineState
from ._routes import ERROR_HANDLERS, ROUTES, STATE_KEY
from .scheduler import EngineLimits, Scheduler

__all__ = ["EngineConfig", "create_app", "load_engine", "serve_engine", "serve_engine_state"]

logger = logging.getLogger(__name__)

_MAX_BODY_BYTES: Final = 256 * 1024 * 1024
DEFAULT_PREFIX_CACHE_TOKENS: Final = 8192  # SmolLM2-135M fp32: 46 KB per token, about 380 MB


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
        prefix_cache_tokens: ids the prefix cache keeps across requests (0 disables it): a
            Session's follow-up turn and the Group's other samples prefill only their new ids.
    """

    model_path: Path = attrs.field(converter=Path)
    host: str = "127.0.0.1"
    port: int = 0
    max_running_requests: int = 16
    context_length: int | None = None
    weight_version: str = "default"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    graceful_timeout_s: float = 2.0
    prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS


def create_app(state: EngineState) -> QuartTrio:
    """Build the quart-trio app serving one engine's scheduler.

    The views are module-level functions (:mod:`relaxtrio.engine._routes`); they reach
    ``state`` through the app (``current_app.extensions``), so one process may serve several
    engines.
    """
    app = QuartTrio(__name__)
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = None
    app.config["MAX_CONTENT_LENGTH"] = _MAX_BODY_BYTES
    app.extensions[STATE_KEY] = state
    for path, endpoint, view, methods in ROUTES:
        app.add_url_rule(path, endpoint, view, methods=list(methods))
    for exc_class, error_handler in ERROR_HANDLERS:
        app.register_error_handler(exc_class, error_handler)
    return app


# ---------------------------------------------------------------- loading and serving
async def load_engine(config: EngineConfig) -> EngineState:
    """Load the model, tokenizer and (for a VLM) image processor, and build the scheduler.

    Cancellation:
        A checkpoint; a load in flight finishes in its worker thread and is dropped.
    """
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
        prefix_cache_tokens=config.prefix_cache_tokens,
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
    state = await load_engine(config)
    await serve_engine_state(
        state, config, shutdown_trigger=shutdown_trigger, task_status=task_status
    )


async def serve_engine_state(
    state: EngineState,
    config: EngineConfig,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve an engine loaded with :func:`load_engine` (tests keep ``state`` to reach its
    scheduler, e.g. :meth:`~relaxtrio.engine.scheduler.Scheduler.wait_statistics`).

    Args:
        state: the loaded engine; its scheduler loop runs here.
        config: bind address, port and graceful timeout (the model fields are not read).
        shutdown_trigger: as :func:`serve_engine`.
        task_status: receives the base URL once listening.

    Cancellation:
        As :func:`serve_engine`.
    """
    hyper = HypercornConfig()
    hyper.bind = [f"{config.host}:{config.port}"]
    hyper.graceful_timeout = config.graceful_timeout_s
    hyper.backlog = LISTEN_BACKLOG  # a gateway or many drivers may connect at once
    hyper.accesslog = None
    hyper.errorlog = logger
    stop = functools.partial(_wait_shutdown, state.scheduler, shutdown_trigger)
    async with trio.open_nursery() as nursery:
        await nursery.start(state.scheduler.run)
        binds = await nursery.start(_serve_http, create_app(state), hyper, stop, nursery.cancel_scope)
        task_status.started(binds[0])


async def _wait_shutdown(
    scheduler: Scheduler, shutdown_trigger: Callable[[], Awaitable[None]] | None
) -> None:
    """hypercorn's shutdown trigger: wait for ``shutdown_trigger``, then abort every request
    so their callers are answered (with partial output) within the graceful timeout."""
    if shutdown_trigger is None:
        await trio.sleep_forever()
    else:
        await shutdown_trigger()
    scheduler.abort_all()


async def _serve_http(
    app: QuartTrio,
    hyper: HypercornConfig,
    shutdown_trigger: Callable[[], Awaitable[None]],
    done: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[list[str]],
) -> None:
    """The engine's HTTP listener: the one place it starts hypercorn (through
    :func:`~relaxtrio._serving.serve_isolated`, which keeps a connection's fault to it).

    Reports hypercorn's bind list once listening; when the listener has shut down (the
    trigger fired and connections drained), cancels ``done`` (the scheduler loop's nursery).

    Cancellation:
        Cancelling closes the listener and open connections at once.
    """
    await serve_isolated(app, hyper, shutdown_trigger=shutdown_trigger, task_status=task_status)
    done.cancel()  # HTTP has shut down: stop the scheduler loop too
