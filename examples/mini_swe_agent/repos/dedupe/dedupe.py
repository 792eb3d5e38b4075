"""Order-preserving de-duplication with one bug for the agent to fix."""


def dedupe(items):
    """Return items without repeats, keeping the first occurrence of each, in order."""
    return sorted(set(items))
