"""The agent process contract: one user harness process per Session, in its own process group.

For each Session relaxtrio:

1. makes a private IO directory holding ``session_input.json`` (written before the start),
   the path ``session_output.json`` (read after the exit) and ``agent.log`` (stdout + stderr);
2. runs ``bash -lc <agent command>`` (an activated virtual environment's ``bin`` put back in
   front of the login shell's PATH) in ``--agent-cwd`` with stdin from ``/dev/null``, the
   ``--agent-env`` entries and the ``RELAX_*`` variables
   (docs/agent-contract.md#environment-variables), in a new process group
   (``start_new_session=True``) led by the :mod:`relaxtrio._reaper` shim, which ends the way
   the agent ended and takes the group down if the driver dies without cleaning up (SIGKILL);
3. waits for the exit under the Session's active-time budget (``--agent-timeout``), a cancel scope
   whose deadline moves when generation is paused (see :class:`ActiveBudget`);
4. whatever happens (normal exit, timeout, error, cancellation of the whole run), terminates the
   whole process group: SIGTERM, a bounded wait, SIGKILL, a bounded wait. Grandchildren that
   outlive the leader are in the same group and are terminated too, and so is any descendant that
   left the group (``setsid``) but still carries the Session's ``RELAX_SESSION_ID``;
5. removes the IO directory.

The exit rules (docs/agent-contract.md#exit-timeouts-and-termination): a timeout, a non-zero exit
code, or an output file that is not valid JSON/JSONL raise :class:`~relaxtrio.AgentExecutionError`,
whose message ends with the last 8 KiB of the agent's combined output.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Final, Literal

import attrs
import trio

from .. import _reaper as reaper
from .._errors import AgentExecutionError, ConfigError
from ..config import RESERVED_ENV_PREFIX, TERM_GRACE_S, AgentConfig

log = logging.getLogger(__name__)

LOG_TAIL_BYTES: Final = 8192
KILL_GRACE_S: Final = 5.0
# Only where pidfds are unavailable (non-Linux, kernels before 5.3): how often to re-check that
# the agent's processes are gone. On Linux the wait is a pidfd per process, woken by its exit.
_FALLBACK_POLL_S: Final = 0.05
# A login shell's profile resets PATH (Debian's /etc/profile does), dropping an activated virtual
# environment; put its bin directory back in front so `python agent.py` means what the user meant.
RESTORE_VENV_PATH: Final = (
    'if [ -n "${VIRTUAL_ENV:-}" ] && [ -d "$VIRTUAL_ENV/bin" ]; then PATH="$VIRTUAL_ENV/bin:$PATH"; fi\n'
)

RolloutMode = Literal["train", "eval"]


def parse_agent_env(entries: list[str] | tuple[str, ...] | None) -> dict[str, str]:
    """Parses ``--agent-env KEY=VALUE ...`` entries (the last duplicate wins).

    Raises:
        ConfigError: an entry without ``=``, an empty key, or a reserved ``RELAX_`` key.
    """
    env: dict[str, str] = {}
    for entry in entries or ():
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"--agent-env entries must look like KEY=VALUE, got {entry!r}.", param="agent_env"
            )
        if key.startswith(RESERVED_ENV_PREFIX):
            raise ConfigError(
                f"--agent-env does not allow reserved key {key!r}.", param="agent_env"
            )
        env[key] = value
    return env




@attrs.define(eq=False, kw_only=True)
class ActiveBudget:
    """A pausable countdown of active seconds, enforced by a cancel scope with a moving deadline.

    While running, ``scope.deadline = trio.current_time() + remaining_s`` (trio clock time);
    paused, ``scope.deadline = math.inf`` and the remaining seconds are remembered. The budget is
    created paused; :meth:`resume` starts it (the Group's Runtime lease).

    Attributes:
        total_s: the whole budget in seconds.
        scope: the cancel scope the agent wait runs in.
    """

    total_s: float
    scope: trio.CancelScope = attrs.field(factory=lambda: trio.CancelScope(deadline=math.inf))
    _remaining_s: float = attrs.field(init=False)
    _running_since: float | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self._remaining_s = self.total_s

    @property
    def running(self) -> bool:
        """Whether the countdown is currently running."""
        return self._running_since is not None

    def remaining_s(self) -> float:
        """Seconds of active time left (never negative)."""
        if self._running_since is None:
            return max(self._remaining_s, 0.0)
        return max(self._remaining_s - (trio.current_time() - self._running_since), 0.0)

    def resume(self) -> None:
        """Starts (or restarts) the countdown. Idempotent."""
        if self._running_since is not None:
            return
        self._running_since = trio.current_time()
        self.scope.deadline = self._running_since + self._remaining_s

    def pause(self) -> None:
        """Stops the countdown and remembers the remaining seconds. Idempotent."""
        if self._running_since is None:
            return
        self._remaining_s = self.remaining_s()
        self._running_since = None
        self.scope.deadline = math.inf

    @property
    def expired(self) -> bool:
        """Whether the scope was cancelled by the deadline."""
        return self.scope.cancelled_caught


@attrs.frozen(kw_only=True)
class AgentRun:
    """What one finished agent process left behind.

    Attributes:
        return_code: the leader's exit code (negative: killed by that signal).
        output_text: contents of RELAX_OUTPUT_JSON, or None when the file was not written.
        log_tail: the last 8 KiB of stdout+stderr, decoded as UTF-8 with replacement.
        active_s: active seconds the budget consumed.
    """

    return_code: int
    output_text: str | None
    log_tail: str
    active_s: float


@attrs.frozen(kw_only=True)
class SessionEnv:
    """The values behind the ``RELAX_*`` variables (minus the IO paths, made per run).

    Attributes:
        max_context_tokens: the Session's context window in tokens (``RELAX_MAX_CONTEXT_TOKENS``),
            or None when unknown (the variable is then unset).
        max_response_tokens: the turn limit of a request that sets none, in tokens
            (``RELAX_MAX_RESPONSE_TOKENS``), or None (unset).
    """

    session_id: str
    group_id: str
    base_url: str
    mode: RolloutMode = "train"
    max_context_tokens: int | None = None
    max_response_tokens: int | None = None


def _read_tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(size - LOG_TAIL_BYTES, 0))
            data = f.read()
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace").rstrip()


def _session_processes(pgid: int, session_id: str | None = None) -> list[int]:
    """Live (non-zombie) processes of an agent: its process group, plus — when ``session_id`` is
    given — any process whose environment carries ``RELAX_SESSION_ID=<session_id>`` (descendants
    that left the group with ``setsid`` or a double fork still inherit the variable).

    Linux /proc scan; elsewhere only the process group is checked.
    """
    proc = Path("/proc")
    if not proc.is_dir():  # pragma: no cover - non-Linux fallback
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    tag = f"RELAX_SESSION_ID={session_id}".encode() if session_id else None
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ... ; comm may contain spaces/parens: split after the last ')'.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) < 3 or fields[0] == "Z":
            continue
        if int(fields[2]) == pgid:
            found.append(int(entry.name))
        elif tag is not None:
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if tag in environ.split(b"\0"):
                found.append(int(entry.name))
    return found


async def _wait_exited(pids: list[int]) -> None:
    """Waits until every process in ``pids`` has exited (its pidfd turns readable).

    Processes already gone are skipped. Without pidfd support this sleeps
    ``_FALLBACK_POLL_S`` instead, and the caller re-checks.

    Cancellation:
        A checkpoint; the pidfds are closed either way.
    """
    fds: list[int] = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                continue
            except (AttributeError, OSError):  # pragma: no cover - no pidfd on this system
                await trio.sleep(_FALLBACK_POLL_S)
                return
        for fd in fds:
            await trio.lowlevel.wait_readable(fd)
    finally:
        for fd in fds:
            os.close(fd)


def _signal_all(pgid: int, pids: list[int], sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


async def terminate_process_group(
    pgid: int,
    process: trio.Process | None = None,
    *,
    term_grace_s: float = TERM_GRACE_S,
    session_id: str | None = None,
) -> None:
    """SIGTERM the agent's processes, wait up to ``term_grace_s``, SIGKILL, wait up to 5 s.

    The agent's processes are its process group and, with ``session_id``, every process still
    carrying that Session's ``RELAX_SESSION_ID`` (so ``setsid``/``nohup`` descendants are found).

    Args:
        pgid: the process group id (the leader's pid).
        process: the leader, reaped here when given.
        term_grace_s: seconds to wait after SIGTERM before SIGKILL.
        session_id: the Session whose tagged descendants are terminated too.

    Cancellation:
        Not a cancellation point for the caller's scopes: the whole sequence runs shielded, so a
        cancelled run still leaves no agent process behind. At most ``term_grace_s`` + 5 s.
    """
    with trio.CancelScope(shield=True):
        for sig, grace_s in ((signal.SIGTERM, term_grace_s), (signal.SIGKILL, KILL_GRACE_S)):
            pids = _session_processes(pgid, session_id)
            if not pids and (process is None or process.returncode is not None):
                break
            _signal_all(pgid, pids, sig)
            with trio.move_on_after(grace_s):
                if process is not None:
                    await process.wait()
                while left := _session_processes(pgid, session_id):
                    await _wait_exited(left)
        if process is not None and process.returncode is None:  # pragma: no cover - defensive
            with trio.move_on_after(1.0):
                await process.wait()
    if _session_processes(pgid, session_id):
        log.error("agent processes of group %d survived SIGKILL", pgid)


_INPUT_FILE: Final = "session_input.json"
_OUTPUT_FILE: Final = "session_output.json"


def _agent_env(config: AgentConfig, session: SessionEnv, io_dir: Path) -> dict[str, str]:
    """The agent's environment: ours, then ``--agent-env``, then the ``RELAX_*`` variables (the
    two limits only when known: an inherited value of ours is removed, never passed on)."""
    env = dict(os.environ)
    env.update(config.env)
    limits = {"RELAX_MAX_CONTEXT_TOKENS": session.max_context_tokens,
              "RELAX_MAX_RESPONSE_TOKENS": session.max_response_tokens}
    for key, value in limits.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    env.update(
        RELAX_INPUT_JSON=str(io_dir / _INPUT_FILE),
        RELAX_OUTPUT_JSON=str(io_dir / _OUTPUT_FILE),
        RELAX_SESSION_IO_DIR=str(io_dir),
        RELAX_BASE_URL=session.base_url,
        RELAX_SESSION_ID=session.session_id,
        RELAX_ROLLOUT_MODE=session.mode,
        RELAX_GROUP_ID=session.group_id,
    )
    return env


def _read_output(output_path: Path, tail: str, session_id: str) -> str | None:
    """The text the agent wrote to RELAX_OUTPUT_JSON, or None when it wrote nothing.

    Raises:
        AgentExecutionError: the file is unreadable or not UTF-8.
    """
    if not output_path.exists():
        return None
    try:
        return output_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AgentExecutionError(
            f"Agent produced invalid output ({exc}).\n{tail}".rstrip(), session_id=session_id,
        ) from exc


async def _start_process(config: AgentConfig, session: SessionEnv, input_payload: Mapping[str, object],
                         io_dir: Path, log_path: Path) -> trio.Process:
    """Writes ``RELAX_INPUT_JSON``'s file into ``io_dir`` and starts ``bash -lc <command>`` in a
    process group of its own, stdout and stderr appended to ``log_path``.

    Raises:
        OSError: the process could not be started.
    """
    (io_dir / _INPUT_FILE).write_text(
        json.dumps(input_payload, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    with log_path.open("ab") as log_file:
        return await trio.lowlevel.open_process(
            reaper.command(["bash", "-lc", RESTORE_VENV_PATH + config.command]),
            cwd=str(config.cwd),
            env=_agent_env(config, session, io_dir),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def run_agent(
    config: AgentConfig,
    session: SessionEnv,
    input_payload: Mapping[str, object],
    budget: ActiveBudget,
    *,
    log_path: Path | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> AgentRun:
    """Runs one agent process to its end under the Session's active-time budget.

    Args:
        config: command, cwd, env and timeout.
        session: the identity and base URL handed to the agent.
        input_payload: JSON object written to ``RELAX_INPUT_JSON`` before the start.
        budget: the pausable active-time budget; the caller resumes it when the Runtime lease
            starts (before that, waiting costs nothing).
        log_path: where the agent's stdout + stderr go (truncated first); the caller owns the
            file. None: ``agent.log`` in the IO directory, removed with it.
        task_status: receives the process-group id once the process started.

    Returns:
        The finished run; the process group is gone and the IO directory removed.

    Raises:
        AgentExecutionError: timed out, exited non-zero, or wrote unparsable output.
        OSError: the process could not be started (e.g. bash missing).

    Cancellation:
        Cancelling terminates the whole process group (shielded, bounded) and removes the IO
        directory before the Cancelled propagates.
    """
    io_dir = Path(tempfile.mkdtemp(prefix="relaxtrio-session-"))
    try:
        if log_path is None:
            log_path = io_dir / "agent.log"
        else:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.write_bytes(b"")
        process = await _start_process(config, session, input_payload, io_dir, log_path)
        pgid = process.pid
        task_status.started(pgid)
        used_before = budget.total_s - budget.remaining_s()
        try:
            with budget.scope:
                await process.wait()
        finally:
            # Normal exit, timeout or cancellation: nothing of this group may survive.
            await terminate_process_group(pgid, process, term_grace_s=config.term_grace_s,
                                          session_id=session.session_id)
        active_s = budget.total_s - budget.remaining_s() - used_before
        tail = _read_tail(log_path)
        if budget.expired:
            raise AgentExecutionError(
                f"Agent timed out after {config.timeout_s:g} s of active time.\n{tail}".rstrip(),
                session_id=session.session_id, timed_out=True,
            )
        rc = process.returncode
        assert rc is not None
        if rc != 0:
            raise AgentExecutionError(
                f"Agent exited with code {rc}.\n{tail}".rstrip(), session_id=session.session_id,
                return_code=rc,
            )
        output_text = _read_output(io_dir / _OUTPUT_FILE, tail, session.session_id)
        return AgentRun(return_code=rc, output_text=output_text, log_tail=tail, active_s=active_s)
    finally:
        shutil.rmtree(io_dir, ignore_errors=True)
