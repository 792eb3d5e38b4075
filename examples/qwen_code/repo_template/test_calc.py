"""The reward: this test passes once calc.add is fixed (run with `python test_calc.py`)."""

from calc import add, mul

assert add(2, 3) == 5, f"add(2, 3) returned {add(2, 3)}"
assert mul(4, 5) == 20
print("all tests passed")
