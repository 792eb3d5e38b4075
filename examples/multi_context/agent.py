"""A multi-agent example: a main agent and two searcher sub-agents, each its own training context.

The main agent gets a question, asks two searchers (separate conversations, run concurrently)
for notes on it, then answers with their notes in view. The process writes three explicit
export records to RELAX_OUTPUT_JSON, one per context:

- ``main``: its conversation, ``metadata = {"role": "main", "outcome": 1.0 | 0.0}`` and the
  outcome as its ``reward`` (the one representative reward of the Session);
- ``searcher_0``, ``searcher_1``: their conversations, ``metadata = {"role": "searcher",
  "outcome": ..., "usefulness": u}`` where ``u`` is the share of the searcher's note words that
  the main answer reused; no reward.

``advantage.credit`` turns that metadata into one credit per context. Train it with::

    python -m relaxtrio train --agent-cwd examples/multi_context --agent-command "python agent.py" \\
        --prompt-data examples/multi_context/data/train.jsonl \\
        --agentic-custom-advantage-path examples.multi_context.advantage.credit \\
        --use-dynamic-batch-size --max-tokens-per-gpu 4096

Like every agent here it is an ordinary openai-SDK program: nothing in it knows about training.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

from openai import AsyncOpenAI

ASPECTS = ("where and when", "who and why")


def words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 2}


async def ask(client: AsyncOpenAI, messages: list[dict], max_tokens: int) -> list[dict]:
    response = await client.chat.completions.create(model="policy", messages=messages, max_tokens=max_tokens)
    return [*messages, response.choices[0].message.model_dump(exclude_none=True)]


async def main() -> None:
    task = json.loads(Path(os.environ["RELAX_INPUT_JSON"]).read_text(encoding="utf-8"))
    meta = task.get("metadata", {})
    question = meta.get("question") or task["messages"][-1]["content"]
    answer = str(meta.get("answer", "")).lower()
    client = AsyncOpenAI(
        base_url=os.environ.get("RELAX_BASE_URL", os.environ.get("OPENAI_BASE_URL")),
        api_key=os.environ.get("RELAX_SESSION_ID", os.environ.get("OPENAI_API_KEY", "none")),
        timeout=3600,  # a request may be held while the Group starts or weights update
        max_retries=2,  # idempotent (docs/agent-contract.md#retries); an empty reply is resampled
    )
    searchers = await asyncio.gather(*(
        ask(client, [{"role": "system", "content": "You are a searcher. Reply with short notes."},
                     {"role": "user", "content": f"Notes on {aspect} for: {question}"}], 32)
        for aspect in ASPECTS
    ))
    notes = [history[-1].get("content") or "" for history in searchers]
    main_history = [{"role": "system", "content": "You coordinate searchers and answer briefly."},
                    {"role": "user", "content": question},
                    {"role": "user", "content": "Searcher notes:\n" + "\n".join(f"- {n}" for n in notes)}]
    main_history = await ask(client, main_history, 32)
    reply = main_history[-1].get("content") or ""
    outcome = 1.0 if answer and answer in reply.lower() else 0.0
    used = words(reply)
    records = [{"name": "main", "messages": main_history,
                "metadata": {"role": "main", "outcome": outcome}, "reward": outcome}]
    for i, (history, note) in enumerate(zip(searchers, notes, strict=True)):
        note_words = words(note)
        usefulness = len(note_words & used) / len(note_words) if note_words else 0.0
        records.append({"name": f"searcher_{i}", "messages": history,
                        "metadata": {"role": "searcher", "outcome": outcome, "usefulness": usefulness}})
    text = "\n".join(json.dumps(r) for r in records) + "\n"
    out_path = os.environ.get("RELAX_OUTPUT_JSON")
    if out_path:
        Path(out_path).write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
