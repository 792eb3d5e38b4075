"""doctor and Claude Code's tool search: a 400 naming ENABLE_TOOL_SEARCH fails the ``endpoint``
check with the setting that turns it off; the recorder keeps the start of each error answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from werkzeug.routing import Map, Rule

from relaxtrio.api.messages import parse_messages_request
from relaxtrio.tools.doctor import _RequestRecorder
from relaxtrio.tools.doctor_checks import Observation, RequestRecord, evaluate

MESSAGES = "/agentic_api/v1/messages"


def _endpoint(tmp_path: Path, *records: RequestRecord) -> tuple[str, str, str]:
    obs = Observation(log_path=tmp_path / "agent.log", started=True, requests=list(records),
                      first_request_s=0.1, return_code=0)
    checks = evaluate(obs, first_request_s=30, min_client_timeout_s=600, agent_timeout_s=60,
                      reward_hook=None, reward_key=None)
    check = next(c for c in checks if c.name == "endpoint")
    return check.status, check.detail, check.fix


def _refusal() -> str:
    body = {"model": "policy", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "P", "input_schema": {"type": "object"}, "defer_loading": True}]}
    try:
        parse_messages_request(body)
    except ValueError as error:
        return json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": str(error)}})
    raise AssertionError("a deferred tool was served")


def test_a_tool_search_refusal_fails_the_endpoint_check_naming_the_setting(tmp_path: Path) -> None:
    refused = RequestRecord(method="POST", path=MESSAGES, status=400, supported=True, error=_refusal())
    served = RequestRecord(method="POST", path=MESSAGES, status=200, supported=True)
    status, detail, fix = _endpoint(tmp_path, refused, served)
    assert status == "fail" and "tool search" in detail
    assert "ENABLE_TOOL_SEARCH=false" in fix
    other = RequestRecord(method="POST", path=MESSAGES, status=400, supported=True, error='{"message": "bad"}')
    assert _endpoint(tmp_path, other, served)[0] == "pass"


async def test_the_recorder_keeps_the_start_of_an_error_answer() -> None:
    answer = _refusal().encode()

    async def app_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        status = 400 if scope["path"] == MESSAGES else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": answer if status == 400 else b"{}"})

    class App:
        asgi_app = staticmethod(app_asgi)
        url_map = Map([Rule(MESSAGES, methods=["POST"]), Rule("/agentic_api/v1/models", methods=["GET"])])

    app = App()
    recorder = _RequestRecorder()
    recorder.install(app)

    async def nothing(message: dict[str, Any]) -> None:
        await trio.lowlevel.checkpoint()

    for method, path in (("POST", MESSAGES), ("GET", "/agentic_api/v1/models")):
        await app.asgi_app({"type": "http", "method": method, "path": path, "headers": []}, None, nothing)
    refused, served = recorder.records
    assert refused.status == 400 and "ENABLE_TOOL_SEARCH=false" in refused.error
    assert served.status == 200 and served.error == ""
