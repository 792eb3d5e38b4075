"""Process checks for tests: is a pid still a live (non-zombie) process?"""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"
