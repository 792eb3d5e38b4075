"""The reward: passes once words.reverse_words reverses (run with `python3 test_words.py`)."""

from words import count_words, reverse_words

assert reverse_words("one two three") == "three two one", reverse_words("one two three")
assert count_words("a b  c") == 3
print("all tests passed")
