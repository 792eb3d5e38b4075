"""A small quiz agent: an ordinary openai-SDK program that relaxtrio trains through.

It reads one task from RELAX_INPUT_JSON, asks the model, checks the answer, and when the answer
is wrong gives feedback and lets the model try once more. It writes its reward to
RELAX_OUTPUT_JSON: 1.0 for a right first answer, 0.5 for a right second answer, else 0.0.

Nothing in it knows about training: point OPENAI_BASE_URL / OPENAI_API_KEY at any
OpenAI-compatible server and it runs the same way (see the fallbacks below).
``QUIZ_MAX_TOKENS`` (default 48) bounds each reply, e.g. ``--agent-env QUIZ_MAX_TOKENS=4`` for
short benchmark steps.
"""

from __future__ import annotations

import asyncio
import os
import sys

from openai import AsyncOpenAI
from quiz import CREDITS, FEEDBACK, MAX_TOKENS, is_correct, read_task, write_reward


async def main() -> None:
    messages, answer, kind = read_task()
    client = AsyncOpenAI(
        base_url=os.environ.get("RELAX_BASE_URL", os.environ.get("OPENAI_BASE_URL")),
        api_key=os.environ.get("RELAX_SESSION_ID", os.environ.get("OPENAI_API_KEY", "none")),
        timeout=3600,  # a request may be held while the Group starts or weights update
        max_retries=2,  # idempotent (docs/agent-contract.md#retries); an empty reply is resampled
    )
    reward, attempts = 0.0, 0
    for attempt, credit in enumerate(CREDITS, start=1):
        response = await client.chat.completions.create(
            model="policy", messages=messages, max_tokens=MAX_TOKENS
        )
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        attempts = attempt
        if is_correct(message.content or "", answer, kind):
            reward = credit
            break
        if attempt == 1:
            messages.append({"role": "user", "content": FEEDBACK})
    write_reward(reward, attempts)
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
