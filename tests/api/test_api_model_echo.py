"""Every protocol's answer names a model: the request's own, else the id ``/v1/models`` lists."""

from __future__ import annotations

import pytest
from tests.api.api_helpers import CHAT, MESSAGES, RESPONSES, ScriptedHandler, post
from tests.support.sessions import open_session

from relaxtrio.api.app import create_app
from relaxtrio.nursery.session import SessionRegistry

USER = [{"role": "user", "content": "hi"}]
BODIES = {
    CHAT: {"messages": USER},
    MESSAGES: {"messages": USER, "max_tokens": 8},
    RESPONSES: {"input": "hi"},
}


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("sent", [None, "gpt-x"])
async def test_the_answer_names_the_sent_model_or_the_listed_one(
        registry: SessionRegistry, path: str, sent: str | None) -> None:
    app = create_app(registry, ScriptedHandler(), model_name="policy-under-training")
    body = dict(BODIES[path]) if sent is None else {**BODIES[path], "model": sent}
    async with open_session(registry) as session:
        status, answer, _ = await post(app, path, body, token=session.session_id)
    assert status == 200, answer
    assert answer["model"] == (sent or "policy-under-training")
