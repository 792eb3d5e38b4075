"""examples/stock_lookup: the reward's grading and the shipped data splits (sizes, disjoint,
reproducible from the seeded generator)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

TASK = Path(__file__).resolve().parents[2] / "examples" / "stock_lookup"
sys.path.insert(0, str(TASK))
import make_data
import stock


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (TASK / "data" / f"{name}.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("reply", "right"), [
    ("47", True), (" 47.\n", True), ("There are 47 pears in stock.", True), ("1,047", False),
    ("12", False), ("47 or 12", False), ("12, no: 47", False), ("", False), ("forty-seven", False),
    ("Answer: 470", False), ("-47", False),
])
def test_a_reply_is_right_when_its_last_number_is_the_count_and_the_other_count_is_absent(
        reply: str, right: bool) -> None:
    assert stock.is_correct(reply, "47", ["12"]) is right


def test_a_task_asks_for_one_of_two_distinct_counts() -> None:
    rng = random.Random(0)
    for _ in range(200):
        row = stock.make_task(rng)
        meta = row["metadata"]
        stock_json = json.loads(row["input"].split("result: ", 1)[1].split("\n", 1)[0])
        assert len(stock_json) == 2 and len(set(stock_json.values())) == 2
        assert str(stock_json[meta["item"]]) == meta["answer"]
        assert meta["others"] == [str(n) for k, n in stock_json.items() if k != meta["item"]]
        assert stock.is_correct(meta["answer"], meta["answer"], meta["others"])


def test_the_shipped_splits_have_their_sizes_and_share_no_prompt() -> None:
    train, held_out = _rows("train"), _rows("eval")
    assert (len(train), len(held_out)) == (make_data.TRAIN_SIZE, make_data.EVAL_SIZE) == (400, 200)
    train_prompts = {r["input"] for r in train}
    eval_prompts = {r["input"] for r in held_out}
    assert len(train_prompts) == 400 and len(eval_prompts) == 200
    assert not train_prompts & eval_prompts


def test_the_shipped_splits_are_what_the_seeded_generator_writes() -> None:
    train, held_out = make_data.make_splits(36)
    assert train == _rows("train") and held_out == _rows("eval")
    assert make_data.make_splits(36) == (train, held_out)
    assert make_data.make_splits(37)[1] != held_out


def test_the_agent_reads_its_task_and_writes_a_binary_reward(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    task = {"messages": [{"role": "user", "content": "q"}], "metadata": {"answer": "47", "others": ["12"]}}
    (tmp_path / "in.json").write_text(json.dumps(task))
    monkeypatch.setenv("RELAX_INPUT_JSON", str(tmp_path / "in.json"))
    monkeypatch.setenv("RELAX_OUTPUT_JSON", str(tmp_path / "out.json"))
    assert stock.read_task() == (task["messages"], "47", ["12"])
    stock.write_reward(1.0, 2)
    assert json.loads((tmp_path / "out.json").read_text()) == {
        "reward": 1.0, "metadata": {"attempts": 2, "solved": True}}
    monkeypatch.setenv("STOCK_ATTEMPTS", "1")
    assert stock.max_attempts() == 1
