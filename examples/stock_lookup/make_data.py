"""Writes the stock-lookup splits: ``data/train.jsonl`` (400 tasks) and ``data/eval.jsonl`` (200
held-out tasks), from one seeded generator, so the shipped files are reproducible byte for byte.

No task appears in both splits: tasks are drawn until the (tool result, question) pairs are
unique, then the first 200 go to eval and the rest to train.

    python examples/stock_lookup/make_data.py [--seed 36] [--out examples/stock_lookup/data]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from stock import make_task

TRAIN_SIZE = 400
EVAL_SIZE = 200


def make_splits(seed: int, train_size: int = TRAIN_SIZE,
                eval_size: int = EVAL_SIZE) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, eval) rows, disjoint by prompt text, the same for the same arguments."""
    rng = random.Random(seed)
    rows: dict[str, dict[str, Any]] = {}
    while len(rows) < train_size + eval_size:
        row = make_task(rng)
        rows.setdefault(row["input"], row)
    ordered = list(rows.values())
    return ordered[eval_size:], ordered[:eval_size]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=36)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data")
    args = parser.parse_args()
    train, held_out = make_splits(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("eval", held_out)):
        text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
        (args.out / f"{name}.jsonl").write_text(text, encoding="utf-8")
        print(f"{args.out / name}.jsonl: {len(rows)} tasks")


if __name__ == "__main__":
    main()
