"""The reward: passes once dedupe keeps first-occurrence order (run with `python3 test_dedupe.py`)."""

from dedupe import dedupe

assert dedupe([3, 1, 3, 2, 1]) == [3, 1, 2], dedupe([3, 1, 3, 2, 1])
assert dedupe([]) == []
print("all tests passed")
