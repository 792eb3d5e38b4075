"""The stock-lookup task's rules, shared by the agent, the data generator, the TRL benchmark and
the tests (standard library only): how a task is written, how a reply is graded, the feedback
turn, and where the reward goes.

A task shows what an inventory tool returned (two items with their counts, 10-99) and asks for
one item's count "with just the number". A reply is right when the last number in it is the
asked count and the other item's count does not appear in it: naming both counts (a trick that
would score half the time) earns nothing.
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Any, Final

FEEDBACK: Final = "That is not correct. Reply with just the number."
ITEMS: Final = (
    "apples", "pears", "plums", "lemons", "onions", "carrots", "bolts", "nails", "screws", "hinges",
    "pencils", "erasers", "folders", "staples", "candles", "matches", "batteries", "bulbs", "cables",
    "fuses", "gloves", "helmets", "ropes", "buckets", "brushes", "tiles", "bricks", "planks",
    "valves", "pumps", "filters", "hoses", "chairs", "tables", "lamps", "shelves", "mugs", "plates",
    "spoons", "forks",
)
_NUMBER: Final = re.compile(r"-?\d+")


def make_task(rng: random.Random) -> dict[str, Any]:
    """One task row drawn from ``rng``: ``{"input": str, "metadata": {"answer": str,
    "others": [str, ...], "item": str}}`` (``others``: the counts of the items not asked for)."""
    names = rng.sample(ITEMS, 2)
    counts = rng.sample(range(10, 100), 2)  # distinct, so "the other count" is well defined
    stock = dict(zip(names, counts, strict=True))
    item = rng.choice(names)
    prompt = (f"Inventory tool result: {json.dumps(stock)}\n"
              f"How many {item} are in stock? Reply with just the number.")
    others = [str(n) for name, n in stock.items() if name != item]
    return {"input": prompt, "metadata": {"answer": str(stock[item]), "others": others, "item": item}}


def is_correct(reply: str, answer: str, others: list[str]) -> bool:
    """True when the last integer in ``reply`` is ``answer`` and none of ``others`` occurs in it."""
    numbers = _NUMBER.findall(reply.replace(",", ""))
    return bool(numbers) and numbers[-1] == answer and not set(others) & set(numbers)


def max_attempts() -> int:
    """Model turns per Session: ``STOCK_ATTEMPTS`` (default 2: the answer, then one retry after
    the feedback turn; 1 is the single-turn variant that both relaxtrio and TRL train)."""
    return int(os.environ.get("STOCK_ATTEMPTS", "2"))


def read_task() -> tuple[list[dict[str, Any]], str, list[str]]:
    """(messages, answer, others) of the task in ``RELAX_INPUT_JSON``."""
    task = json.loads(Path(os.environ["RELAX_INPUT_JSON"]).read_text(encoding="utf-8"))
    meta = task["metadata"]
    return task["messages"], str(meta["answer"]), [str(o) for o in meta["others"]]


def write_reward(reward: float, attempts: int) -> None:
    """Writes the outcome to ``RELAX_OUTPUT_JSON`` (stdout when it is unset)."""
    output = {"reward": reward, "metadata": {"attempts": attempts, "solved": reward > 0}}
    out_path = os.environ.get("RELAX_OUTPUT_JSON")
    if out_path:
        Path(out_path).write_text(json.dumps(output), encoding="utf-8")
    else:
        print(json.dumps(output))
