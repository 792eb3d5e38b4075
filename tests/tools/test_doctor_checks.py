"""The doctor's pure checks on hand-made observations (relaxtrio.tools.doctor_checks.evaluate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from relaxtrio.tools.doctor_checks import Observation, RequestRecord, evaluate

CHAT = "/agentic_api/v1/chat/completions"


def _client_timeout(tmp_path: Path, *answers: tuple[int, int]) -> tuple[str, str]:
    """The client_timeout check over requests answered ``(status, retry_count)`` in order."""
    requests = [RequestRecord(method="POST", path=CHAT, status=status, supported=True,
                              client_timeout_s=1800.0, retry_count=retry) for status, retry in answers]
    obs = Observation(log_path=tmp_path / "agent.log", started=True, requests=requests,
                      first_request_s=0.1, return_code=0)
    checks = evaluate(obs, first_request_s=30, min_client_timeout_s=600, agent_timeout_s=60,
                      reward_hook=None, reward_key=None)
    check = next(c for c in checks if c.name == "client_timeout")
    return check.status, check.detail


@pytest.mark.parametrize("answers", [
    [(200, 0), (200, 0)],
    [(500, 0), (200, 1)],  # an empty reply, sampled again
    [(503, 0), (503, 1), (200, 2)],  # an overload, twice
    [(429, 0), (200, 1), (500, 0), (200, 1)],
])
def test_retries_after_an_answer_are_the_sdks_normal_retries(tmp_path: Path, answers) -> None:
    assert _client_timeout(tmp_path, *answers) == ("pass", "read timeout 1800 s")


@pytest.mark.parametrize("answers", [
    [(200, 1)],  # its first attempt got no answer: the client gave up
    [(200, 0), (200, 1)],
    [(500, 0), (200, 1), (200, 1)],  # one answered error explains one retry only
    [(400, 0), (200, 1)],  # a 4xx is not retried by the SDKs
])
def test_a_retry_with_no_answer_before_it_is_a_client_timeout(tmp_path: Path, answers) -> None:
    status, detail = _client_timeout(tmp_path, *answers)
    assert status == "fail"
    assert detail.startswith(f"the client retried POST {CHAT} (retry 1): it gave up waiting")


@pytest.mark.parametrize(("window", "asked", "prompt", "status"), [
    (32768, 32000, 700, "pass"),
    (32768, 32000, 1000, "warn"),  # Claude Code's default output for an unknown model
    (None, 32000, 1000, "pass"),  # the window is unknown
    (32768, None, 1000, "pass"),  # the request set no limit: the turn gets the room
])
def test_output_room_warns_when_the_first_request_asks_past_the_window(
        tmp_path: Path, window: int | None, asked: int | None, prompt: int, status: str) -> None:
    requests = [RequestRecord(method="POST", path=CHAT, status=200, supported=True, client_timeout_s=1800.0)]
    obs = Observation(log_path=tmp_path / "agent.log", started=True, requests=requests, first_request_s=0.1,
                      return_code=0, max_context_tokens=window, first_output_tokens=asked,
                      first_prompt_tokens=prompt)
    checks = evaluate(obs, first_request_s=30, min_client_timeout_s=600, agent_timeout_s=60,
                      reward_hook=None, reward_key=None)
    check = next(c for c in checks if c.name == "output_room")
    assert check.status == status, check.detail
    if status == "warn":
        assert check.detail.startswith("the first request asks for 32000 output tokens but the 32768-token "
                                       "window leaves 31768 after its 1000 prompt tokens")
        assert "RELAX_MAX_CONTEXT_TOKENS" in check.fix
