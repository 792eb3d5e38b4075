"""Crash-safe file writes: temporary file or directory, fsync, rename (stdlib only).

A rename within one file system is atomic, so a reader (or a process started after a crash)
sees either the old complete file or the new complete file. The data is fsync-ed before the
rename and the parent directory after it, so a power loss cannot leave a renamed but empty file.

May import: the standard library only (used by :mod:`relaxtrio.train` and :mod:`relaxtrio.rollout`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["fsync_dir", "fsync_tree", "write_bytes_atomic", "write_text_atomic"]


def fsync_dir(directory: Path) -> None:
    """Flushes a directory's entries (created, renamed or removed names) to disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flushes every regular file under ``root`` and every directory, ``root`` included."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    """Replaces ``path`` with ``data`` (temp file in the same directory, fsync, rename, fsync dir).

    Returns:
        ``path``. The file gets the modes a plain ``open(path, "w")`` would give it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    replaced = False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
        replaced = True
    finally:
        if not replaced:
            Path(tmp).unlink(missing_ok=True)
    fsync_dir(path.parent)
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    """:func:`write_bytes_atomic` of ``text`` encoded as UTF-8."""
    return write_bytes_atomic(path, text.encode("utf-8"))
