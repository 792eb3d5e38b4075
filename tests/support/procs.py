"""Process checks for tests: is a pid still a live (non-zombie) process, and pids an agent reports."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process remains in process group ``pgid`` (Linux /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended meanwhile
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # state ppid pgrp ... (comm may hold ')')
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


class PidPipe:
    """A named pipe that a test's agent writes pids into; the test waits for them, without polling.

    The test end is opened read-write, so the pipe always has a writer: reads wait for data
    instead of seeing end-of-file, and an agent opening it for writing never blocks.
    """

    def __init__(self, path: Path) -> None:
        import trio

        os.mkfifo(path)
        self.path = path
        self._stream = trio.lowlevel.FdStream(os.open(path, os.O_RDWR | os.O_NONBLOCK))
        self._buffer = b""

    async def read_pids(self, count: int) -> list[int]:
        """Waits until ``count`` newline-terminated pids arrived in total; returns all so far."""
        while self._buffer.count(b"\n") < count:
            self._buffer += await self._stream.receive_some()
        return [int(p) for p in self._buffer.split()]

    async def aclose(self) -> None:
        """Closes the test end."""
        await self._stream.aclose()


def descendants(pid: int) -> list[int]:
    """Live (non-zombie) descendants of ``pid`` (a /proc scan)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
