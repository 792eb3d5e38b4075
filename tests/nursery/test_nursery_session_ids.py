"""Session ids are the agents' bearer credentials: at least 128 random bits each."""

from __future__ import annotations

from relaxtrio.nursery.session import new_session_id


def test_session_ids_carry_at_least_128_random_bits() -> None:
    draws = [new_session_id() for _ in range(2000)]
    assert len(set(draws)) == len(draws)
    values = []
    for sid in draws:
        assert sid.startswith("session-")
        digits = sid.removeprefix("session-")
        assert len(digits) * 4 >= 128
        values.append(int(digits, 16))
    # Every one of the 128 bit positions varies like a fair coin (mean 1000, sd ~22 over 2000).
    for bit in range(128):
        ones = sum((v >> bit) & 1 for v in values)
        assert 800 < ones < 1200, f"bit {bit} is set in {ones} of 2000 ids"
