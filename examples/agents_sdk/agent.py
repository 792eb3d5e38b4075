"""An OpenAI Agents SDK agent over the Responses API: one agent with a unit-conversion tool.

Reads the task from ``--input-json`` (``{"messages": [...], "metadata": {"answer": "42"}}``; the
system message becomes the agent's instructions, the rest its input), runs it with
``Runner.run`` on ``OpenAIResponsesModel`` against ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``
(tracing off: no traffic but the model's), and writes ``{"reward": 1.0 | 0.0, "metadata":
{...}}`` to ``--output-json``. Nothing in it knows about training.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from pathlib import Path

from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded
from openai import AsyncOpenAI

_PER_METRE = {"m": 1.0, "km": 1000.0, "cm": 0.01, "mm": 0.001, "mile": 1609.344, "ft": 0.3048}
conversions: list[str] = []


@function_tool
def convert_length(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a length between m, km, cm, mm, mile and ft."""
    conversions.append(f"{value} {from_unit}->{to_unit}")
    if from_unit not in _PER_METRE or to_unit not in _PER_METRE:
        return f"unknown unit; use one of {sorted(_PER_METRE)}"
    return f"{value * _PER_METRE[from_unit] / _PER_METRE[to_unit]:g} {to_unit}"


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input-json", type=Path, required=True)
    parser.add_argument("--output-json", type=Path, required=True)
    parser.add_argument("--max-turns", type=int, default=4)
    args = parser.parse_args()
    task = json.loads(args.input_json.read_text(encoding="utf-8"))
    instructions = "\n".join(m["content"] for m in task["messages"] if m["role"] == "system")
    history = [{"role": m["role"], "content": m["content"]} for m in task["messages"] if m["role"] != "system"]
    answer = str(task.get("metadata", {}).get("answer", ""))
    set_tracing_disabled(True)
    client = AsyncOpenAI(timeout=3600, max_retries=2)  # requests may be held for a long time
    agent = Agent(name="converter", instructions=instructions, tools=[convert_length],
                  model=OpenAIResponsesModel(model="policy", openai_client=client))
    try:
        result = await Runner.run(agent, history, max_turns=args.max_turns,
                                  run_config=RunConfig(tracing_disabled=True))
        final = str(result.final_output or "")
    except MaxTurnsExceeded:
        final = ""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", final.replace(",", ""))
    reward = 1.0 if numbers and float(numbers[-1]) == float(answer) else 0.0
    args.output_json.write_text(json.dumps({"reward": reward, "metadata": {"conversions": len(conversions)}}),
                                encoding="utf-8")
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
