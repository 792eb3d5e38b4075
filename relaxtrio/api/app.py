"""The agent-facing HTTP server: quart-trio on hypercorn, bound to 127.0.0.1.

Routes live under :data:`ROUTE_PREFIX` (``/agentic_api``); the base URL handed to agents is
``http://127.0.0.1:<port>/agentic_api/``. Standard clients append their own resource paths to
it (the openai SDK ``chat/completions`` and ``responses``, the anthropic SDK ``/v1/messages``),
so both the ``/v1`` routes and the unversioned aliases are served:

* ``POST /v1/chat/completions`` — OpenAI Chat Completions (aliases ``/chat/completions``, ``/``);
* ``POST /v1/responses`` — OpenAI Responses (alias ``/responses``);
* ``POST /v1/messages`` — Anthropic Messages (alias ``/messages``);
* ``POST /v1/messages/count_tokens`` — Anthropic token counting: ``{"input_tokens": N}`` for the
  prompt that Messages body would generate from, nothing generated or committed (alias
  ``/messages/count_tokens``);
* ``GET /v1/models`` — the served model id (alias ``/models``);
* ``GET /health`` — liveness and the number of live Sessions (also ``/healthz``, and both at the
  server root).
* ``HEAD`` on the base URL (with or without the trailing ``/``, and on ``/v1``) — 200 with no body: Claude Code probes its base URL
  with ``HEAD`` before the first request and reports a 404 as an unreachable API.

Every model request authenticates with its Session id (:mod:`.auth`): missing or malformed
credential → 401, unknown or finished Session → 401 ``session_discarded`` (an auth failure to
the harness CLIs, which neither retry it nor blame the model name). Then the body is read
and normalized by the protocol's adapter (400 with ``param``), the turn runs in the Session's
nursery (so a client disconnect never cancels a generation), and the result is rendered as JSON
or Buffered SSE (:mod:`.sse`). Errors always use the protocol's JSON envelope (:mod:`.errors`);
nothing answers with HTML — unknown routes, wrong methods and too-large bodies included.

``POST`` on the model routes is answered on plain ASGI by :class:`~.asgi.ModelRoutes`, installed
as the app's ``asgi_app`` (quart's own request cycle cost about a third of a bare route); quart
serves everything else, including the other methods on those paths (405).
"""

from __future__ import annotations

import functools
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Final

import attrs
import hypercorn.config
import trio
from quart import Response, current_app, has_websocket_context, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from .._errors import ConfigError, InternalError, InvalidRequestError, RelaxError
from .._serving import LISTEN_BACKLOG, serve_isolated
from .._validate import loads_utf8_json
from ..config import ApiConfig
from ..nursery.session import SessionRegistry
from ..nursery.turns import TurnHandler
from .asgi import BodyTooLarge, JsonReply, ModelCall, ModelRoutes
from .auth import session_token
from .body_memo import BodyMemo
from .chat import CHAT
from .errors import (
    GENERIC_INTERNAL_MESSAGE,
    RENDER_FAILED_MESSAGE,
    MethodNotAllowedError,
    RequestTooLargeError,
    RouteNotFoundError,
    client_disconnect,
    describe_request,
    error_response,
    log_rejected,
)
from .ignored import report_ignored
from .messages import MESSAGES, parse_count_tokens_request
from .options import CODEX_COMPACTION_HINT
from .responses import RESPONSES
from .session_memo import SessionMemos
from .sse import sse_response
from .wire import ProtocolAdapter, encode_json

log = logging.getLogger(__name__)

ROUTE_PREFIX: Final = "/agentic_api"
_STATE_KEY: Final = "relaxtrio.api"  # app.extensions key of the app's _ApiState
ROUTES: Final = {
    CHAT: ("/v1/chat/completions", "/chat/completions", "/"),
    RESPONSES: ("/v1/responses", "/responses"),
    MESSAGES: ("/v1/messages", "/messages"),
}
COUNT_TOKENS_ROUTES: Final = ("/v1/messages/count_tokens", "/messages/count_tokens")


def json_response(payload: Any, status: int = 200) -> Response:
    """A compact JSON response (non-ASCII kept)."""
    return Response(encode_json(payload), status=status, content_type="application/json")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_loads: Final = functools.partial(json.loads, parse_constant=_reject_constant)


async def _read_json_object(call: ModelCall, memo: BodyMemo | None = None) -> dict[str, Any]:
    """The request body as a JSON object (through the Session's ``memo`` when given, which
    decodes only what is new since its previous body: :mod:`.body_memo`).

    Raises:
        InvalidRequestError: not JSON (not UTF-8, e.g. UTF-16, or invalid UTF-8: "not valid UTF-8
            JSON"; syntax; ``NaN``), nested too deeply, or not an object; ``param`` is ``body``.
        BodyTooLarge: the body is larger than the configured limit (rendered as 413).

    Cancellation:
        Waits for the body; a client that disconnects cancels the read.
    """
    raw = await call.body()
    try:
        body = loads_utf8_json(raw, _loads if memo is None else memo.loads)
    except RecursionError:
        raise InvalidRequestError("Invalid request body: nested too deeply", param="body") from None
    except ValueError as exc:  # JSONDecodeError, a constant, not UTF-8
        raise InvalidRequestError(f"Invalid request body: {exc}", param="body") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("Request body must be a JSON object", param="body")
    return body


def _protocol_of_path(path: str) -> ProtocolAdapter:
    return MESSAGES if path.rstrip("/").endswith(("/messages", "/messages/count_tokens")) else CHAT


@attrs.frozen(kw_only=True)
class _ApiState:
    """What the views of one app serve from (held by the app, see :func:`_api`)."""

    registry: SessionRegistry
    handler: TurnHandler
    config: ApiConfig
    listed_model: str | None
    # Per live Session: what its previous model request parsed into (:mod:`.session_memo`).
    memos: SessionMemos = attrs.field(factory=lambda: SessionMemos(lambda: BodyMemo(_reject_constant)))


def _api() -> _ApiState:
    """The state of the app serving the current request (set by :func:`create_app`)."""
    state: _ApiState = current_app.extensions[_STATE_KEY]
    return state


@attrs.define
class _Progress:
    """How far a model request got, for the log line of a client that went away."""

    session_id: str | None = None
    body_read: bool = False


_Responder = Callable[[_ApiState, ProtocolAdapter, ModelCall, _Progress], Awaitable["Response | JsonReply"]]


async def _model_response(state: _ApiState, adapter: ProtocolAdapter, call: ModelCall,
                          progress: _Progress) -> Response | JsonReply:
    """Authenticate, read and parse the body, run the turn, and render it (JSON or SSE).

    Raises:
        RelaxError: authentication (401/404), validation (400), or the turn's own error.
        InternalError: rendering the result failed.
        BodyTooLarge: the body is larger than the configured limit (413).

    Cancellation:
        Cancelling (a client disconnect) abandons the wait; the turn itself runs in the
        Session's nursery and is committed anyway.
    """
    session = state.registry.get(session_token(call.headers))
    progress.session_id = session.session_id
    memo = state.memos.of(session)
    body = await _read_json_object(call, memo.body)
    progress.body_read = True
    try:
        parsed = adapter.parse(body, memo)
    except RecursionError:
        raise InvalidRequestError("Invalid request body: nested too deeply", param="body") from None
    report_ignored(session, parsed.ignored, protocol=adapter.name, strict=state.config.strict_request_fields)
    if parsed.model is None:  # every protocol's answer names a model: the one /v1/models lists
        parsed = attrs.evolve(parsed, model=state.listed_model)
    if parsed.stream:
        pending = session.start_turn(state.handler, parsed.turn)
        # Errors known before generation (context length, a message the template cannot
        # render) are answered as JSON before the stream opens: a client that sees a stream
        # fail retries without streaming (Claude Code), paying for the same request twice.
        await pending.wait_prepared()
        if pending.failed_early:
            await pending.result()  # raises the turn's error
        return sse_response(adapter, parsed, pending.result, state.config.heartbeat_s,
                            target=call.target, session_id=session.session_id)
    result = await session.start_turn(state.handler, parsed.turn).result_unless(call.disconnected)
    if result is None:  # the client went away; the turn goes on for a retry
        await call.gone()
    try:
        payload = adapter.render_json(result, parsed)
    except Exception:
        log.exception("rendering a %s response failed", adapter.name)
        raise InternalError(RENDER_FAILED_MESSAGE) from None
    return JsonReply(encode_json(payload))


async def _count_tokens_response(state: _ApiState, adapter: ProtocolAdapter, call: ModelCall,
                                 progress: _Progress) -> JsonReply:
    """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, N being the tokens of the
    prompt a Messages request with this body would generate from (lineage plus rendered new
    observation). Authenticated like a model request; nothing is generated or committed.

    Raises:
        RelaxError: authentication (401/404) or validation (400).
        BodyTooLarge: the body is larger than the configured limit (413).

    Cancellation:
        Safe at any point (nothing is committed).
    """
    session = state.registry.get(session_token(call.headers))
    progress.session_id = session.session_id
    body = await _read_json_object(call)
    progress.body_read = True
    turn, dropped_tools = parse_count_tokens_request(body)
    if state.config.strict_request_fields and dropped_tools:  # as a model request would be refused
        raise dropped_tools[0].error()
    num_tokens = await state.handler.count_tokens(session.forest, turn)
    return JsonReply(encode_json({"input_tokens": num_tokens}))


async def _dispatch(state: _ApiState, adapter: ProtocolAdapter, respond: _Responder,
                    call: ModelCall) -> Response | JsonReply:
    """The view of every model route of ``adapter``'s protocol (``respond`` answers it: a turn,
    or a token count), served by :class:`~.asgi.ModelRoutes`: errors become the protocol's
    envelope.

    Cancellation:
        A client disconnect cancels it (logged as a 499 line); the turn goes on in its Session.
    """
    progress = _Progress()
    answered = False
    try:
        response = await respond(state, adapter, call, progress)
        answered = True
        return response
    except BodyTooLarge:
        answered = True
        # Answered here, where the Session (already authenticated) is known.
        too_large = _too_large(state, progress.session_id)
        log_rejected(adapter.name, too_large, None, target=call.target)
        return error_response(too_large, adapter.name)
    except RelaxError as exc:
        answered = True
        if exc.http_status >= 500:
            log.warning("%s request failed (%s): %s", adapter.name,
                        describe_request(exc.http_status, target=call.target,
                                         session_id=progress.session_id or exc.session_id),
                        exc.message)
        else:
            log_rejected(adapter.name, exc, progress.session_id, target=call.target)
        return error_response(exc, adapter.name)
    except Exception:
        answered = True
        log.exception("unhandled error in a %s request", adapter.name)
        return error_response(InternalError(GENERIC_INTERNAL_MESSAGE), adapter.name)
    finally:
        if not answered:  # only a cancellation (the client went away) gets here
            disconnect = client_disconnect(body_read=progress.body_read)
            log.info("%s (%s)", disconnect.message,
                     describe_request(499, target=call.target, session_id=progress.session_id))


async def _served_by_model_routes() -> Response:
    """quart's view of the model routes' ``POST``, which :class:`~.asgi.ModelRoutes` answers
    before quart sees the request; the rules exist so that other methods get 405.

    Raises:
        InternalError: always (only a caller that bypasses the app's ``asgi_app`` gets here).
    """
    raise InternalError("model routes are answered by ModelRoutes, the app's asgi_app")


async def _models() -> Response:
    return json_response(
        {"object": "list",
         "data": [{"id": _api().listed_model, "object": "model", "created": 0, "owned_by": "relaxtrio"}]}
    )


async def _head() -> Response:
    return Response(b"", status=200)


async def _health() -> Response:
    return json_response({"ok": True, "active_sessions": len(_api().registry)})


def _too_large(state: _ApiState, session_id: str | None) -> RequestTooLargeError:
    return RequestTooLargeError(f"Request body is larger than {state.config.max_body_bytes} bytes",
                                param="body", session_id=session_id)


def _request_target() -> tuple[str, str]:
    """``(method, path)`` of what is being answered: an HTTP request, or a WebSocket handshake
    (which has no ``request`` object; no route serves WebSockets, so it is always refused)."""
    if has_websocket_context():
        return "GET", websocket.path
    return request.method, request.path


async def _http_error(exc: HTTPException) -> Response:
    status = exc.code or 500
    method, path = _request_target()
    err: RelaxError
    if has_websocket_context() and status in (400, 404, 405):
        status = 400  # werkzeug's WebsocketMismatch on a model route, or no route at all
        err = InvalidRequestError(f"WebSocket is not served at {path}: send HTTP requests")
    elif status == 404 and path.rstrip("/").endswith("/responses/compact"):
        status, err = 400, InvalidRequestError(f"{method} {path} is not supported: {CODEX_COMPACTION_HINT}")
    elif status == 404:
        err = RouteNotFoundError(f"No route for {method} {path}")
    elif status == 405:
        err = MethodNotAllowedError(f"Method {method} is not allowed for {path}")
    elif status == 413:
        err = _too_large(_api(), None)
    elif status >= 500:
        err = InternalError(GENERIC_INTERNAL_MESSAGE)
    else:
        err = InvalidRequestError(exc.description or exc.name or "Bad request")
    if status < 500:
        log_rejected(_protocol_of_path(path).name, err, None, status=status, target=f"{method} {path}")
    response = error_response(err, _protocol_of_path(path).name)
    response.status_code = status
    return response


async def _unexpected_error(exc: Exception) -> Response:
    log.error("unhandled error outside a model endpoint", exc_info=exc)
    return error_response(InternalError(GENERIC_INTERNAL_MESSAGE), _protocol_of_path(_request_target()[1]).name)


def create_app(
    registry: SessionRegistry,
    handler: TurnHandler,
    *,
    model_name: str | None = None,
    config: ApiConfig | None = None,
) -> QuartTrio:
    """Builds the agent-facing app.

    The views are module-level functions; they reach ``registry``, ``handler`` and ``config``
    through the app (``current_app.extensions``).

    Args:
        registry: live Sessions by bearer token.
        handler: generates and commits turns (:class:`~relaxtrio.rollout.turns.EngineTurnHandler`).
        model_name: the id listed by ``/v1/models``; overrides ``config.model_name``.
        config: heartbeat interval, body limit and model id; defaults to :class:`ApiConfig`.

    Returns:
        A QuartTrio app; serve it with :func:`serve_api` (or drive it with ``app.test_client()``).
    """
    config = config or ApiConfig()
    app = QuartTrio("relaxtrio.api", static_folder=None)  # the dashboard's files: operator listener only
    # Generations can be held for minutes (barrier, partial rollout): no response/body timeouts.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = None
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    state = app.extensions[_STATE_KEY] = _ApiState(
        registry=registry, handler=handler, config=config,
        listed_model=model_name if model_name is not None else config.model_name,
    )
    views = {}
    for adapter, paths in ROUTES.items():
        for path in paths:
            views[ROUTE_PREFIX + path] = functools.partial(_dispatch, state, adapter, _model_response)
    for path in COUNT_TOKENS_ROUTES:
        views[ROUTE_PREFIX + path] = functools.partial(_dispatch, state, MESSAGES, _count_tokens_response)
    for path in views:
        app.add_url_rule(path, "model" + path, _served_by_model_routes, methods=["POST"])
    # quart types ASGI callables with hypercorn's TypedDict scopes and events; ModelRoutes speaks
    # plain ASGI dicts (the same values), hence the ignores.
    app.asgi_app = ModelRoutes(  # type: ignore[method-assign, assignment]
        app.asgi_app, views, config.max_body_bytes)  # type: ignore[arg-type]
    for path in ("/v1/models", "/models"):
        app.add_url_rule(ROUTE_PREFIX + path, "models" + path, _models, methods=["GET"])
    for path in ("", "/", "/v1", "/v1/"):
        app.add_url_rule(ROUTE_PREFIX + path, "head" + path, _head, methods=["HEAD"])
    for path in ("/health", "/healthz"):
        app.add_url_rule(ROUTE_PREFIX + path, "health" + path, _health, methods=["GET"])
        app.add_url_rule(path, "root_health" + path, _health, methods=["GET"])
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected_error)
    return app


def hypercorn_config(host: str, port: int) -> hypercorn.config.Config:
    """hypercorn settings of our listeners (agent API, operator): one bind, no access log,
    long keep-alive, a deep listen backlog (:data:`~relaxtrio._serving.LISTEN_BACKLOG`), 1 s
    graceful close."""
    config = hypercorn.config.Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = log
    config.keep_alive_timeout = 120
    config.backlog = LISTEN_BACKLOG
    config.graceful_timeout = 1
    return config


@attrs.frozen
class _BaseUrlStatus:
    """hypercorn's ``task_status``: turns its bind list into the agents' base URL."""

    task_status: trio.TaskStatus[str]

    def started(self, binds: list[str]) -> None:
        self.task_status.started(binds[0].rstrip("/") + ROUTE_PREFIX + "/")


async def serve_api(
    app: QuartTrio,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serves ``app`` with hypercorn until cancelled; reports the agents' base URL when bound.

    This is the one place the API starts hypercorn (through :func:`~relaxtrio._serving.serve_isolated`,
    which keeps a fault inside one connection to that connection).

    Args:
        app: the app from :func:`create_app`.
        host: interface to bind (loopback by default).
        port: TCP port; 0 picks a free one.
        task_status: receives ``http://<host>:<port>/agentic_api/``.

    Cancellation:
        Cancelling stops the server; in-flight requests are cancelled with it (their turns
        keep running in their Sessions' nurseries).
    """
    config = hypercorn_config(host, port)
    await serve_isolated(app, config, task_status=_BaseUrlStatus(task_status))  # type: ignore[arg-type]


async def start_api(nursery: trio.Nursery, app: QuartTrio, *, host: str, port: int, flag: str) -> str:
    """Starts :func:`serve_api` in ``nursery``; returns the agents' base URL once bound.

    Raises:
        ConfigError: ``host:port`` cannot be bound (in use, not an address of this machine),
            naming ``flag``, the command-line option that set the port.
    """
    try:
        if port:  # hypercorn leaks its socket when the bind fails: find out first, cleanly
            socket.create_server((host, port)).close()
        url: str = await nursery.start(functools.partial(serve_api, app, host=host, port=port))
    except OSError as exc:  # raised by the bind, before the API started
        raise ConfigError(f"{flag} {port}: the agent API cannot listen on {host}:{port} "
                          f"({exc.strerror or exc})", param=flag) from exc
    return url
