"""Word helpers with one bug for the agent to fix."""


def reverse_words(text):
    """Return the words of text in reverse order, joined by single spaces."""
    return " ".join(text.split())


def count_words(text):
    """Return the number of whitespace-separated words in text."""
    return len(text.split())
