"""The quiz agent of ``agent.py`` on Python's standard library alone (``urllib``), no SDK.

Same task, same two attempts, same reward; it shows that any HTTP client speaking Chat
Completions trains the same way, and it starts in about a tenth of the CPU time: importing
the ``openai`` SDK costs about 0.5 s of CPU per process here, which 16 agents a step pay on the
same cores as the engine and the trainer (``benchmarks/step_profile.py`` compares both under
``--agentic-prelaunch``). Run it with ``--agent-command "python agent_stdlib.py"``.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from quiz import CREDITS, FEEDBACK, MAX_TOKENS, is_correct, read_task, write_reward

RETRIES = 2  # like the SDK's max_retries: the request is idempotent (docs/agent-contract.md#retries)
RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})


def chat(base_url: str, api_key: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One Chat Completions request; the reply's message. Retries connection failures (also a
    connection lost mid-answer) and the statuses the SDK retries, then raises the last error."""
    body = json.dumps({"model": "policy", "messages": messages, "max_tokens": MAX_TOKENS}).encode()
    request = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions", data=body, method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
    attempt = 0
    while True:
        try:
            # a request may be held while the Group starts or weights update
            with urllib.request.urlopen(request, timeout=3600) as response:
                return json.loads(response.read())["choices"][0]["message"]
        except urllib.error.HTTPError as exc:
            if exc.code not in RETRY_STATUSES or attempt == RETRIES:
                raise
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError):
            if attempt == RETRIES:
                raise
        time.sleep(0.5 * 2**attempt)
        attempt += 1


def main() -> None:
    messages, answer, kind = read_task()
    base_url = os.environ.get("RELAX_BASE_URL", os.environ.get("OPENAI_BASE_URL", ""))
    api_key = os.environ.get("RELAX_SESSION_ID", os.environ.get("OPENAI_API_KEY", "none"))
    reward, attempts = 0.0, 0
    for attempt, credit in enumerate(CREDITS, start=1):
        message = chat(base_url, api_key, messages)
        messages.append({k: v for k, v in message.items() if v is not None})
        attempts = attempt
        if is_correct(message.get("content") or "", answer, kind):
            reward = credit
            break
        if attempt == 1:
            messages.append({"role": "user", "content": FEEDBACK})
    write_reward(reward, attempts)


if __name__ == "__main__":
    main()
    sys.exit(0)
