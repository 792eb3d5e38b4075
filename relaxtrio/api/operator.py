"""The operator listener: ``/debug_state`` and the live ``/dashboard``, never on the agents' listener.

Session ids are credentials (an agent authenticates with its own), so nothing an agent can reach
lists them: the agent API (:mod:`.app`) serves only the model routes, ``/v1/models`` and
``/health`` (a count). What lists Sessions is a second app, :func:`create_operator_app`, served
by :func:`serve_operator` on its own port (``--operator-port``), 127.0.0.1 only, and every data
route there also needs the operator token (``Authorization: Bearer <token>``), a fresh random
token printed once at start-up (:func:`operator_line`): agents run on the same machine and can
reach any loopback port, so the port alone would not keep them out (docs/dashboard.md#access).

Routes (all ``GET``, JSON unless noted):

* ``/debug_state``: the job's state (:meth:`OperatorSource.debug_state`);
* ``/debug_state/sessions/<session_id>``: one Session's record with its forest and timeline;
* ``/debug_state/groups/<group_id>``: one Group's Sessions side by side (Group comparison);
* ``/debug_state/steps``: the per-step series the dashboard plots and the ``metrics.jsonl``
  rows the step view shows;
* ``/dashboard``: the dashboard page (HTML); ``/dashboard/static/<name>``: its script and
  style sheet, shipped in the package (no CDN). These two serve only the static files, which
  hold no data, so a browser can load them without a header; the page reads the token from the
  URL fragment (``/dashboard#token=...``, which browsers never send to a server) and sends it
  as a bearer header with every data request, refreshing itself every
  :data:`REFRESH_MS` milliseconds.

Errors use the OpenAI envelope (``{"error": {"message", "type", "param", "code"}}``): 401
without the token, 404 for an unknown route or Session.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from importlib import resources
from typing import Any, Final, Protocol

import attrs
import trio
from quart import Response, current_app, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from .._errors import AuthenticationError, NotFoundError, RelaxError
from .._serving import serve_isolated
from .app import hypercorn_config, json_response
from .auth import session_token
from .errors import error_response

OPERATOR_HOST: Final = "127.0.0.1"
"""The operator listener binds loopback only."""

REFRESH_MS: Final = 2000
"""Milliseconds between the dashboard's refreshes."""

_STATE_KEY: Final = "relaxtrio.operator"
_ASSETS: Final = {"dashboard.js": "text/javascript", "views.js": "text/javascript",
                  "dashboard.css": "text/css"}


class OperatorSource(Protocol):
    """What the operator routes read (:class:`~relaxtrio.rollout.operator_view.RunView`)."""

    def debug_state(self) -> Mapping[str, Any]:
        """The job's Groups, Sessions, in-flight requests, agents and pipeline snapshot."""
        ...

    def session_detail(self, session_id: str) -> Mapping[str, Any] | None:
        """One Session's record (its forest included), or None when it is not shown."""
        ...

    def group_detail(self, group_id: str) -> Mapping[str, Any] | None:
        """One Group's Sessions side by side, or None when it is not shown."""
        ...

    def steps(self) -> Sequence[Mapping[str, Any]]:
        """Per finished step: ``step``, ``reward_mean``, ``step_s``, ``tokens_per_s``, ..."""
        ...

    def metrics(self) -> Sequence[Mapping[str, Any]]:
        """The finished steps' ``metrics.jsonl`` rows as written."""
        ...


def new_operator_token() -> str:
    """A fresh, unguessable operator token (URL-safe)."""
    return "op-" + secrets.token_urlsafe(24)


def operator_line(url: str, token: str) -> str:
    """The start-up line that hands the operator the dashboard URL and the token."""
    return (f"# operator: dashboard {url}/dashboard#token={token} ; "
            f"curl -H 'Authorization: Bearer {token}' {url}/debug_state")


@attrs.frozen
class _OperatorState:
    source: OperatorSource
    token: str


def _state() -> _OperatorState:
    state: _OperatorState = current_app.extensions[_STATE_KEY]
    return state


def _authorize() -> None:
    """Checks the operator token of the current request (constant-time comparison).

    Raises:
        AuthenticationError: no bearer token, or not the operator's.
    """
    token = session_token(request.headers)
    if not secrets.compare_digest(token.encode(), _state().token.encode()):
        raise AuthenticationError("Invalid operator token")


def _guarded(view: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """Wraps a data view: the operator token first, errors as JSON envelopes."""

    @functools.wraps(view)
    async def guarded(**kwargs: Any) -> Response:
        try:
            _authorize()
            return await view(**kwargs)
        except RelaxError as exc:
            return error_response(exc, "chat")

    return guarded


async def _debug_state() -> Response:
    return json_response(_state().source.debug_state())


async def _session(session_id: str) -> Response:
    detail = _state().source.session_detail(session_id)
    if detail is None:
        raise NotFoundError(f"No Session {session_id!r} is shown")
    return json_response(detail)


async def _group(group_id: str) -> Response:
    detail = _state().source.group_detail(group_id)
    if detail is None:
        raise NotFoundError(f"No Group {group_id!r} is shown")
    return json_response(detail)


async def _steps() -> Response:
    source = _state().source
    return json_response({"steps": list(source.steps()), "metrics": list(source.metrics())})


def _asset(name: str) -> str:
    return (resources.files("relaxtrio.api") / "static" / name).read_text(encoding="utf-8")


async def _dashboard() -> Response:
    page = _asset("dashboard.html").replace("{{REFRESH_MS}}", str(REFRESH_MS))
    return Response(page, content_type="text/html; charset=utf-8",
                    headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})


async def _static(name: str) -> Response:
    if name not in _ASSETS:
        return error_response(NotFoundError(f"No dashboard asset {name!r}"), "chat")
    return Response(_asset(name), content_type=f"{_ASSETS[name]}; charset=utf-8",
                    headers={"Cache-Control": "no-store"})


async def _http_error(exc: HTTPException) -> Response:
    """Unknown routes, wrong methods, WebSocket handshakes: a JSON envelope with the status."""
    response = error_response(NotFoundError("No such operator route (GET /debug_state, /dashboard)"), "chat")
    response.status_code = exc.code or 500
    return response


def create_operator_app(source: OperatorSource, *, token: str) -> QuartTrio:
    """Builds the operator app (see the module docstring).

    Args:
        source: what the routes show.
        token: the operator token every data route requires (:func:`new_operator_token`).

    Returns:
        A QuartTrio app; serve it with :func:`serve_operator`.
    """
    app = QuartTrio("relaxtrio.operator", static_folder=None)
    app.extensions[_STATE_KEY] = _OperatorState(source=source, token=token)
    app.add_url_rule("/debug_state", "debug_state", _guarded(_debug_state), methods=["GET"])
    app.add_url_rule("/debug_state/steps", "steps", _guarded(_steps), methods=["GET"])
    app.add_url_rule("/debug_state/sessions/<session_id>", "session", _guarded(_session),
                     methods=["GET"])
    app.add_url_rule("/debug_state/groups/<group_id>", "group", _guarded(_group), methods=["GET"])
    app.add_url_rule("/dashboard", "dashboard", _dashboard, methods=["GET"])
    app.add_url_rule("/dashboard/static/<name>", "dashboard_static", _static, methods=["GET"])
    app.register_error_handler(HTTPException, _http_error)
    return app


@attrs.frozen
class _UrlStatus:
    """hypercorn's ``task_status``: reports the listener's base URL."""

    task_status: trio.TaskStatus[str]

    def started(self, binds: list[str]) -> None:
        self.task_status.started(binds[0].rstrip("/"))


async def serve_operator(
    app: QuartTrio,
    *,
    port: int = 0,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serves the operator app on 127.0.0.1 until cancelled; reports ``http://127.0.0.1:<port>``.

    Args:
        app: the app from :func:`create_operator_app`.
        port: TCP port (``--operator-port``); 0 picks a free one.
        task_status: receives the listener's base URL once bound.

    Cancellation:
        Cancelling stops the listener and its open connections.
    """
    config = hypercorn_config(OPERATOR_HOST, port)
    await serve_isolated(app, config, task_status=_UrlStatus(task_status))  # type: ignore[arg-type]


async def start_operator(
    nursery: trio.Nursery,
    source: OperatorSource,
    *,
    port: int,
    announce: Callable[[str], None],
) -> str:
    """Starts the operator listener in ``nursery`` with a fresh token and announces both.

    Args:
        nursery: where the listener runs (it stops when the nursery is cancelled).
        source: what the routes show.
        port: ``--operator-port`` (0: a free one).
        announce: receives the :func:`operator_line` (stdout in the CLI: the token is printed,
            never logged).

    Returns:
        The listener's base URL, ``http://127.0.0.1:<port>``.

    Cancellation:
        A checkpoint while the listener binds.
    """
    token = new_operator_token()
    app = create_operator_app(source, token=token)
    url: str = await nursery.start(functools.partial(serve_operator, app, port=port))
    announce(operator_line(url, token))
    return url
