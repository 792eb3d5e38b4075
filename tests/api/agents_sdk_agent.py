"""A real agent process: the OpenAI Agents SDK with one function tool, pointed at RELAX_BASE_URL.

Run by ``test_api_agents_sdk.py`` with ``sys.executable``; the SDK needs asyncio, which is why it
runs in its own process, exactly as user agents do. Prints one JSON line with the final outputs.
"""

from __future__ import annotations

import asyncio
import json
import os

from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

calls: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """Current weather of a city."""
    calls.append(city)
    return f"{city}: sunny, 21 C"


async def main() -> None:
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=os.environ["RELAX_BASE_URL"], api_key=os.environ["RELAX_SESSION_ID"],
                         max_retries=0, timeout=60)
    outputs = {}
    for name, model in (("responses", OpenAIResponsesModel(model="policy", openai_client=client)),
                        ("chat", OpenAIChatCompletionsModel(model="policy", openai_client=client))):
        agent = Agent(name="weather", instructions="Answer with the weather tool.", model=model, tools=[get_weather])
        city = "Paris" if name == "responses" else "Rome"
        result = await Runner.run(agent, f"What is the weather in {city}?")
        outputs[name] = result.final_output
    await client.close()
    print(json.dumps({"outputs": outputs, "tool_calls": calls}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
