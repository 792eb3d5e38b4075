"""An anthropic-SDK tool_use loop: the model looks facts up in a small table until it answers.

Reads the task from ``--input-json`` (``{"messages": [...], "metadata": {"answer": "Nairobi"}}``;
a leading system message becomes the Messages ``system`` field), talks to any Anthropic-compatible
server (``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY``), answers every ``tool_use`` block with a
``tool_result`` block, for at most ``--max-turns`` model calls, streaming each request. Writes
``{"reward": 1.0 | 0.0, "metadata": {...}}`` to ``--output-json``: 1.0 when the final text names
the expected answer. Nothing in it knows about training.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from pathlib import Path

from anthropic import AsyncAnthropic

FACTS = {"kenya": "Nairobi", "peru": "Lima", "norway": "Oslo", "vietnam": "Hanoi", "ghana": "Accra"}
TOOLS = [{
    "name": "lookup_capital",
    "description": "The capital city of a country.",
    "input_schema": {"type": "object", "properties": {"country": {"type": "string"}},
                     "required": ["country"]},
}]


def lookup_capital(country: str) -> str:
    return FACTS.get(country.strip().lower(), f"no entry for {country!r}")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input-json", type=Path, required=True)
    parser.add_argument("--output-json", type=Path, required=True)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    task = json.loads(args.input_json.read_text(encoding="utf-8"))
    system = "\n".join(m["content"] for m in task["messages"] if m["role"] == "system")
    messages = [{"role": m["role"], "content": m["content"]} for m in task["messages"] if m["role"] != "system"]
    answer = str(task.get("metadata", {}).get("answer", ""))
    client = AsyncAnthropic(timeout=3600, max_retries=2)  # requests may be held for a long time
    tool_uses, final = 0, ""
    for _ in range(args.max_turns):
        async with client.messages.stream(model="policy", system=system, messages=messages, tools=TOOLS,
                                          max_tokens=args.max_tokens) as stream:
            reply = await stream.get_final_message()
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            final = "".join(b.text for b in reply.content if b.type == "text")
            break
        tool_uses += len(uses)
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b.id, "content": lookup_capital(str(b.input.get("country", "")))}
            for b in uses]})
    reward = 1.0 if answer and re.search(rf"\b{re.escape(answer)}\b", final, re.I) else 0.0
    args.output_json.write_text(json.dumps({"reward": reward, "metadata": {"tool_uses": tool_uses}}),
                                encoding="utf-8")
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
