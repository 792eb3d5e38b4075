"""The quiz's rules, shared by both agents of this example (no dependency beyond the standard
library): how a reply is graded, the feedback after a wrong first answer, the reward of each
attempt, and where the reward goes."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Final

FEEDBACK: Final = "That is not correct. Try again and reply with only the answer."
CREDITS: Final = (1.0, 0.5)  # reward of a right answer at the first and at the second attempt
MAX_TOKENS: Final = int(os.environ.get("QUIZ_MAX_TOKENS", "48"))


def is_correct(reply: str, answer: str, kind: str) -> bool:
    """Numbers: the last integer in the reply equals the answer. Words: the answer appears."""
    if kind == "number":
        numbers = re.findall(r"-?\d+", reply.replace(",", ""))
        return bool(numbers) and numbers[-1] == answer
    return re.search(rf"\b{re.escape(answer.lower())}\b", reply.lower()) is not None


def read_task() -> tuple[list[dict[str, Any]], str, str]:
    """(messages, answer, kind) of the task in ``RELAX_INPUT_JSON``."""
    task = json.loads(Path(os.environ["RELAX_INPUT_JSON"]).read_text(encoding="utf-8"))
    meta = task.get("metadata", {})
    return task["messages"], str(meta["answer"]), meta.get("kind", "number")


def write_reward(reward: float, attempts: int) -> None:
    """Writes the outcome to ``RELAX_OUTPUT_JSON`` (stdout when it is unset)."""
    output = {"reward": reward, "metadata": {"attempts": attempts, "solved": reward > 0}}
    out_path = os.environ.get("RELAX_OUTPUT_JSON")
    if out_path:
        Path(out_path).write_text(json.dumps(output), encoding="utf-8")
    else:
        print(json.dumps(output))
