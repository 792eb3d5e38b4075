"""The directories a training run uses: the ``--load`` checkpoint it resumes from
(:class:`ResumePoint`), the ``--load`` / ``--save`` pairs that make sense
(:func:`check_checkpoint_dirs`, :func:`forks_run`), and one run per directory
(:func:`hold_run_dirs`).

What a checkpoint holds and how it is saved and put back is :mod:`relaxtrio.run.checkpoint`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from .._errors import ConfigError
from ..train.checkpoint import (
    _ITER_RE,
    RUN_STATE_FILE,
    _complete_iterations,
    find_run_checkpoint,
    read_run_state,
)

log = logging.getLogger(__name__)

__all__ = ["RUN_LOCK_FILE", "ResumePoint", "check_checkpoint_dirs", "find_resume_point", "forks_run",
           "hold_run_dirs", "unreadable"]


@attrs.frozen(kw_only=True)
class ResumePoint:
    """A run checkpoint found by ``--load``.

    Attributes:
        checkpoint_dir: the ``iter_*`` directory (weights, optimizer, ``state.json``).
        state: its ``state.json``.
    """

    checkpoint_dir: Path
    state: Mapping[str, Any]

    @property
    def steps_done(self) -> int:
        """Completed steps: the resumed run starts at this rollout id."""
        return int(self.state["steps_done"])

    @property
    def output_dir(self) -> Path | None:
        """The output directory of the run that wrote the checkpoint."""
        value = self.state.get("run", {}).get("output_dir")
        return Path(value) if value else None


def find_resume_point(load_dir: Path | None, *, log_missing: bool = True) -> ResumePoint | None:
    """The checkpoint ``--load load_dir`` resumes from; None for no flag or no checkpoint there.

    Args:
        load_dir: the ``--load`` directory, or None.
        log_missing: log a warning when ``load_dir`` holds no checkpoint (a fresh start); it
            says whether the directory does not exist, is not a directory or is empty of
            checkpoints.

    Raises:
        ConfigError: the checkpoint found is unreadable or of an unknown format.
    """
    if load_dir is None:
        return None
    checkpoint = find_run_checkpoint(load_dir)
    if checkpoint is None:
        if log_missing:
            log.warning("--load %s: %s; starting from the beginning", load_dir,
                        _why_no_checkpoint(Path(load_dir)))
        return None
    try:
        state = read_run_state(checkpoint)
    except (OSError, ValueError) as exc:
        raise ConfigError(unreadable(checkpoint, exc, what=RUN_STATE_FILE), param="load") from exc
    return ResumePoint(checkpoint_dir=checkpoint, state=state)


def check_checkpoint_dirs(load_dir: Path | None, save_dir: Path | None) -> None:
    """Refuses ``--load`` / ``--save`` pairs that would resume nothing or mix runs by mistake,
    before anything starts.

    * ``--load L`` where L holds no checkpoint starts from the beginning only when L is also the
      ``--save`` directory (``--save D --load D`` from a run's first start on). Any other L is
      most likely a mistyped path, and starting over would cost the run it meant to resume.
    * ``--save S`` must be a directory (or not exist yet), and neither a checkpoint itself nor
      inside one (what a run writes there is never found by ``--load`` of its parent, and
      ``--load S`` would resume the checkpoint S itself).
    * ``--save S`` where S already holds a run checkpoint needs that checkpoint to be the one
      resumed (``--load S``, or ``--load`` of one of S's ``iter_*`` directories): otherwise the new
      run would write its checkpoints beside the old run's and move ``latest`` off them.

    Raises:
        ConfigError: ``param`` is ``load`` or ``save``; the message names the directory and what
            it holds.
    """
    resumed = find_run_checkpoint(load_dir) if load_dir is not None else None
    if load_dir is not None and resumed is None and not _same_dir(load_dir, save_dir):
        raise ConfigError(
            f"--load {str(load_dir)!r}: {_why_no_checkpoint(Path(load_dir))}, so there is nothing to "
            "resume; to start a run that can resume later, pass the same directory as --save and "
            "--load (a fresh start while it holds no checkpoint)", param="load")
    if save_dir is None:
        return
    save_dir = Path(save_dir)
    if save_dir.exists() and not save_dir.is_dir():
        raise ConfigError(f"--save {str(save_dir)!r} is not a directory", param="save")
    # The directory itself, or an ``iter_*`` checkpoint above it (any other state.json up the
    # tree belongs to something else).
    above = [d for d in save_dir.resolve().parents if _ITER_RE.match(d.name)]
    inside = next((d for d in (save_dir, *above) if (d / RUN_STATE_FILE).is_file()), None)
    if inside is not None:
        where = "a run checkpoint" if _same_dir(inside, save_dir) else f"inside the run checkpoint {str(inside)!r}"
        raise ConfigError(f"--save {str(save_dir)!r} is {where}: pass the directory that holds the "
                          f"checkpoints ({str(inside.parent)!r}) as --save", param="save")
    existing = find_run_checkpoint(save_dir)
    if existing is None:
        return
    if resumed is not None and any(_same_dir(save_dir, d) for d in (load_dir, resumed, resumed.parent)):
        return
    if resumed is None:
        raise ConfigError(
            f"--save {str(save_dir)!r} already holds a run checkpoint ({existing.name}) and this run "
            f"starts from the beginning: pass --load {str(save_dir)!r} to resume it, or a --save "
            "directory without checkpoints", param="save")
    raise ConfigError(
        f"--save {str(save_dir)!r} already holds a run checkpoint ({existing.name}) and this run "
        f"resumes another one ({str(resumed)!r}): pass --load {str(save_dir)!r} to resume the "
        "first, or a --save directory without checkpoints to fork the second", param="save")


RUN_LOCK_FILE: Final = ".relaxtrio.lock"
"""Held (``flock``) by the run using a run or ``--save`` directory; it holds that run's pid."""


@contextlib.contextmanager
def hold_run_dirs(output_dir: Path, save_dir: Path | None) -> Iterator[None]:
    """Holds the run's output directory and ``--save`` directory for this process while inside.

    Two runs writing one directory interleave their ``metrics.jsonl`` rows and overwrite each
    other's checkpoints (a scheduler that restarts a job while the old driver still runs does
    exactly that). Each directory gets an exclusive ``flock`` on its :data:`RUN_LOCK_FILE`, which
    the kernel drops when the process ends in any way (kill -9 included), so nothing stale is
    ever left to clear by hand. Creates the directories.

    Raises:
        ConfigError: a directory cannot be created, or another live run holds it (``param``
            ``output_dir`` or ``save``; the message has that run's pid).
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(_hold_dir(Path(output_dir), "output_dir"))
        if save_dir is not None and not _same_dir(save_dir, output_dir):  # one lock per directory
            stack.enter_context(_hold_dir(Path(save_dir), "save"))
        yield


@contextlib.contextmanager
def _hold_dir(directory: Path, param: str) -> Iterator[None]:
    flag = "--" + param.replace("_", "-")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / RUN_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError(f"{flag} {str(directory)!r}: cannot create it ({exc.strerror})",
                          param=param) from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise ConfigError(f"{flag} {str(directory)!r} is in use by another run (pid {holder}); "
                              "wait for it to end or pass another directory", param=param) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def forks_run(load_dir: Path | None, save_dir: Path | None) -> bool:
    """Whether a run that resumes ``--load load_dir`` writes its checkpoints elsewhere (a fork):
    ``save_dir`` is given and is neither ``load_dir`` nor the directory of its checkpoint.

    A fork starts a run directory of its own (metrics, plots), so the run it forked from keeps
    its rows; a resume that saves in place, or does not save, continues the checkpoint's run
    directory.
    """
    if load_dir is None or save_dir is None:
        return False
    resumed = find_run_checkpoint(load_dir)
    places = (load_dir,) if resumed is None else (load_dir, resumed, resumed.parent)
    return not any(_same_dir(save_dir, d) for d in places)


def _same_dir(a: Path | None, b: Path | None) -> bool:
    return a is not None and b is not None and Path(a).resolve() == Path(b).resolve()


def _why_no_checkpoint(load_dir: Path) -> str:
    """What ``--load load_dir`` found instead of a checkpoint, for the fresh-start warning."""
    if not load_dir.exists():
        return "the directory does not exist"
    if not load_dir.is_dir():
        return "not a directory"
    return "the directory holds no run checkpoint"


def unreadable(checkpoint: Path, exc: BaseException, *, what: str | None = None) -> str:
    """The message of a checkpoint that ``--load`` found but cannot load (``what``: the file
    that failed, when known), naming the newest earlier complete checkpoint beside it."""
    where = f"its {what}: " if what else ""
    text = (f"--load: the checkpoint {checkpoint} cannot be read ({where}{type(exc).__name__}: "
            f"{exc})")
    earlier = [d for d in _complete_iterations(checkpoint.parent) if d.name < checkpoint.name]
    if earlier:
        text += (f"; an earlier complete checkpoint is {earlier[-1]}: pass --load {earlier[-1]} "
                 f"to resume from it (or move {checkpoint.name} aside)")
    return text
