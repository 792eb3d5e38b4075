"""An openai-SDK tool loop: the model may call a calculator (several calls at once) until it answers.

Reads the task from the file named by ``--input-json`` (``{"messages": [...], "metadata":
{"answer": "391"}}``), talks to any OpenAI-compatible server (``OPENAI_BASE_URL`` /
``OPENAI_API_KEY``), runs every tool call the model makes (parallel calls in one reply included)
and sends the results back, for at most ``--max-turns`` model calls. It writes ``{"reward": 1.0 |
0.0, "metadata": {...}}`` to ``--output-json``: 1.0 when the last integer of the final answer is
the expected one. Nothing in it knows about training.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import operator
import re
from pathlib import Path

from openai import AsyncOpenAI

TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 17 * 23"}},
            "required": ["expression"],
        },
    },
}]
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg}


def calculate(expression: str) -> str:
    """The calculator tool: arithmetic only (no names, no calls); errors come back as text."""
    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("only numbers and + - * / ( ) are allowed")
    try:
        value = ev(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def run_tool(name: str, arguments: str) -> str:
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return "error: arguments are not JSON"
    if name != "calculator" or not isinstance(args, dict):
        return f"error: unknown tool {name!r}"
    return calculate(str(args.get("expression", "")))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input-json", type=Path, required=True)
    parser.add_argument("--output-json", type=Path, required=True)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    task = json.loads(args.input_json.read_text(encoding="utf-8"))
    messages = task["messages"]
    answer = str(task.get("metadata", {}).get("answer", ""))
    # A request may be held while the Group starts or weights update: a long timeout, no retries.
    client = AsyncOpenAI(timeout=3600, max_retries=2)
    tool_calls = 0
    final = ""
    for _ in range(args.max_turns):
        response = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=args.max_tokens)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            final = message.content or ""
            break
        for call in message.tool_calls:
            tool_calls += 1
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": run_tool(call.function.name, call.function.arguments)})
    numbers = re.findall(r"-?\d+", final.replace(",", ""))
    reward = 1.0 if numbers and numbers[-1] == answer else 0.0
    args.output_json.write_text(json.dumps({"reward": reward, "metadata": {"tool_calls": tool_calls}}),
                                encoding="utf-8")
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
