"""The stock-lookup agent: asks the model for one item's count and, when the answer is wrong,
says so (a feedback turn) and lets it answer once more (``STOCK_ATTEMPTS``, default 2).

Reward 1.0 when an attempt is right, else 0.0: binary, so an eval's mean reward is its pass@1
(one Session per prompt). It speaks Chat Completions over Python's standard library (no SDK: an
agent process starts in a few tens of milliseconds of CPU, which matters when 16-32 of them
start every step on two cores). Point OPENAI_BASE_URL at any OpenAI-compatible server to run it
outside training.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from stock import FEEDBACK, is_correct, max_attempts, read_task, write_reward

RETRIES = 2  # the request is idempotent (docs/agent-contract.md#retries)


def chat(base_url: str, api_key: str, messages: list[dict[str, Any]]) -> str:
    """One Chat Completions request; the reply's text. Retries connection failures and 5xx."""
    body = json.dumps({"model": "policy", "messages": messages}).encode()
    request = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions", data=body, method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
    for attempt in range(RETRIES + 1):
        try:
            # a request may be held while the Group starts or weights update
            with urllib.request.urlopen(request, timeout=3600) as response:
                return json.loads(response.read())["choices"][0]["message"].get("content") or ""
        except urllib.error.HTTPError as exc:
            if exc.code < 500 or attempt == RETRIES:
                raise
        except (urllib.error.URLError, ConnectionError):
            if attempt == RETRIES:
                raise
        time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


def main() -> None:
    messages, answer, others = read_task()
    base_url = os.environ.get("RELAX_BASE_URL", os.environ.get("OPENAI_BASE_URL", ""))
    api_key = os.environ.get("RELAX_SESSION_ID", os.environ.get("OPENAI_API_KEY", "none"))
    reward, attempts = 0.0, 0
    for attempts in range(1, max_attempts() + 1):
        reply = chat(base_url, api_key, messages)
        messages.append({"role": "assistant", "content": reply})
        if is_correct(reply, answer, others):
            reward = 1.0
            break
        messages.append({"role": "user", "content": FEEDBACK})
    write_reward(reward, attempts)


if __name__ == "__main__":
    main()
    sys.exit(0)
