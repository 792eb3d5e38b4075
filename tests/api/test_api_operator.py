"""The operator listener (``/debug_state``, ``/dashboard``) and what an agent can reach.

Session ids are credentials. The agent API lists none of them and serves no debug route; the
operator app lists them all, but only with the operator token. Real Sessions with committed
turns (the real turn pipeline on a scripted engine), no fakes of the parts under test.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from tests.api.api_helpers import CHAT, post, scripted_pipeline
from tests.support.sessions import open_session

from relaxtrio.api.app import create_app
from relaxtrio.api.operator import (
    create_operator_app,
    new_operator_token,
    operator_line,
)
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.nursery.session import Session, SessionRegistry
from relaxtrio.rollout.operator_view import RunView
from relaxtrio.testing.scripted_engine import Reply

SECRET = "zebra-quartz-7781"  # what only the victim Session's conversation contains


@asynccontextmanager
async def _two_sessions(compiler: ChatCompiler) -> AsyncIterator[tuple[Any, SessionRegistry, Session, Session]]:
    """An agent app with two live Sessions; the victim has committed one turn mentioning SECRET."""
    handler, _ = scripted_pipeline(compiler, lambda ids: Reply(text="noted"), reasoning_parser=None)
    registry = SessionRegistry()
    app = create_app(registry, handler, model_name="tiny")
    async with open_session(registry, group_id="train:group_attacker") as attacker, \
            open_session(registry, group_id="train:group_victim") as victim:
        status, body, _ = await post(app, CHAT, {"model": "m", "messages": [
            {"role": "user", "content": f"remember {SECRET}"}]}, token=victim.session_id)
        assert status == 200, body
        assert len(victim.forest) == 2
        yield app, registry, attacker, victim


def _rule_paths(app: Any) -> list[tuple[str, str]]:
    """Every (method, concrete path) the app routes (path variables filled with the victim's id
    placeholder, replaced by the caller)."""
    out = []
    for rule in app.url_map.iter_rules():
        path = re.sub(r"<[^>]+>", "VICTIM", rule.rule)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            out.append((method, path))
    return out


async def _request(app: Any, method: str, path: str, *, token: str, body: bytes) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}", "content-type": "application/json"}
    async with app.test_app() as test_app:
        client = test_app.test_client()
        response = await client.open(path, method=method, data=body if method == "POST" else None,
                                     headers=headers)
        text = await response.get_data(as_text=True)
    return response.status_code, text + json.dumps(dict(response.headers))


async def test_an_agent_learns_no_other_session_id_or_forest_through_any_agent_route(compiler) -> None:
    async with _two_sessions(compiler) as (app, _, attacker, victim):
        bodies = [
            b"{}",
            json.dumps({"model": "m", "messages": [{"role": "user", "content": "list sessions"}]}).encode(),
            json.dumps({"model": "m", "input": "hi", "max_tokens": 4}).encode(),
            json.dumps({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}).encode(),
        ]
        targets = _rule_paths(app) + [
            ("GET", p) for p in ("/debug_state", "/dashboard", "/agentic_api/debug_state",
                                 "/agentic_api/dashboard", "/debug_state/sessions/VICTIM",
                                 "/agentic_api/v1/sessions/VICTIM", "/agentic_api/v1/models/VICTIM")]
        assert len(targets) > 10
        for method, template in targets:
            for body in bodies if method == "POST" else [b""]:
                path = template.replace("VICTIM", victim.session_id)
                status, text = await _request(app, method, path, token=attacker.session_id, body=body)
                # The victim's id appears only where the attacker itself put it (the URL path of
                # a 404 it asked for); never in anything the server chose to reveal.
                revealed = text.replace(path, "")
                assert victim.session_id not in revealed, (method, path, status, text[:300])
                assert SECRET not in text, (method, path, status, text[:300])
        assert not any("static" in path for _, path in _rule_paths(app))
        for path in ("/debug_state", "/dashboard", "/agentic_api/debug_state", "/static/dashboard.js",
                     "/dashboard/static/dashboard.js"):
            status, _ = await _request(app, "GET", path, token=attacker.session_id, body=b"")
            assert status == 404, path
        # A token one character off the victim's is no credential either.
        status, _, _ = await post(app, CHAT, {"model": "m", "messages": [{"role": "user", "content": "x"}]},
                                  token=victim.session_id[:-1] + ("0" if victim.session_id[-1] != "0" else "1"))
        assert status == 401  # an unknown Session is an auth failure (docs/agent-contract.md#authentication)


async def _get(app: Any, path: str, token: str | None) -> tuple[int, Any, str]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with app.test_app() as test_app:
        response = await test_app.test_client().get(path, headers=headers)
        text = await response.get_data(as_text=True)
    try:
        return response.status_code, json.loads(text), response.content_type
    except ValueError:
        return response.status_code, text, response.content_type


async def test_the_operator_app_needs_its_token_and_then_shows_every_session_and_forest(compiler) -> None:
    async with _two_sessions(compiler) as (_, _, attacker, victim):
        view = RunView(kind="serve")
        view.watch([attacker.group, victim.group])  # type: ignore[list-item]
        token = new_operator_token()
        app = create_operator_app(view, token=token)
        for path in ("/debug_state", "/debug_state/steps", f"/debug_state/sessions/{victim.session_id}",
                     "/debug_state/groups/train:group_victim"):
            for wrong in (None, attacker.session_id, victim.session_id, token[:-1]):
                status, body, _ = await _get(app, path, wrong)
                assert status in (401, 404) and status != 200, (path, wrong)
                assert victim.session_id not in json.dumps(body).replace(str(wrong), "")
        status, state, _ = await _get(app, "/debug_state", token)
        assert status == 200
        assert state["totals"]["group_count"] == 2 and state["totals"]["session_count"] == 2
        assert state["pipeline"] is None  # serve: no rollout pipeline
        ids = [s["session_id"] for g in state["groups"] for s in g["sessions"]]
        assert ids == [attacker.session_id, victim.session_id]
        victim_row = state["groups"][1]["sessions"][0]
        assert victim_row["turn_count"] == 1 and victim_row["forest_nodes"] == 2
        assert victim_row["num_requests"] == 1 and victim_row["inflight_rids"] == []
        status, detail, _ = await _get(app, f"/debug_state/sessions/{victim.session_id}", token)
        assert status == 200 and detail["forest"]["num_nodes"] == 2
        assert [n["kind"] for n in detail["forest"]["nodes"]] == ["observation", "response"]
        assert SECRET in json.dumps(detail["forest"]["nodes"][0]["messages"])
        [turn] = detail["timeline"]["requests"]  # the one request, answered from the scripted engine
        assert turn["state_hash"] == detail["forest"]["nodes"][1]["state_hash"]
        assert [s["kind"] for s in turn["spans"]] == ["engine"] and turn["completion_tokens"] > 0
        status, group, _ = await _get(app, "/debug_state/groups/train:group_victim", token)
        assert status == 200 and [s["session_id"] for s in group["sessions"]] == [victim.session_id]
        assert group["sessions"][0]["turns"] == 1 and group["first_divergence"]["message"] is None
        status, _, _ = await _get(app, "/debug_state/groups/train:nope", token)
        assert status == 404
        status, missing, _ = await _get(app, "/debug_state/sessions/session-nope", token)
        assert status == 404 and missing["error"]["type"] == "not_found_error"
        status, steps, _ = await _get(app, "/debug_state/steps", token)
        assert status == 200 and steps == {"steps": [], "metrics": []}


async def test_the_dashboard_page_and_assets_ship_in_the_package_without_a_cdn() -> None:
    app = create_operator_app(RunView(kind="serve"), token=new_operator_token())
    status, page, content_type = await _get(app, "/dashboard", None)
    assert status == 200 and content_type.startswith("text/html")
    assert 'data-refresh-ms="2000"' in page and "/dashboard/static/dashboard.js" in page
    for name, kind in (("dashboard.js", "text/javascript"), ("views.js", "text/javascript"),
                       ("dashboard.css", "text/css")):
        status, asset, content_type = await _get(app, f"/dashboard/static/{name}", None)
        assert status == 200 and content_type.startswith(kind) and len(asset) > 500
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", asset), name  # no CDN, no remote
    assert not re.search(r"https?://", page)
    status, _, _ = await _get(app, "/dashboard/static/../operator.py", None)
    assert status == 404
    status, _, _ = await _get(app, "/dashboard/static/secret.txt", None)
    assert status == 404


def test_operator_line_names_the_dashboard_and_the_token() -> None:
    line = operator_line("http://127.0.0.1:4321", "op-abc")
    assert "http://127.0.0.1:4321/dashboard#token=op-abc" in line
    assert "Authorization: Bearer op-abc" in line and "/debug_state" in line


async def test_serve_operator_binds_loopback_on_its_own_port() -> None:
    from relaxtrio.api.operator import serve_operator

    app = create_operator_app(RunView(kind="serve"), token="op-t")
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_operator, app)
        assert url.startswith("http://127.0.0.1:")
        nursery.cancel_scope.cancel()
