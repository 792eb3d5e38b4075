"""How a Session's agent process is started and stopped: :class:`AgentConfig`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Literal

import attrs

from .._errors import ConfigError
from .._validate import is_real

__all__ = [
    "AGENT_TIMEOUT_S",
    "EXPORT_POLICY_NAMES",
    "RESERVED_ENV_PREFIX",
    "TERM_GRACE_S",
    "AgentConfig",
    "ExportPolicyName",
]


ExportPolicyName = Literal["strict", "final", "all-leaves"]
EXPORT_POLICY_NAMES: Final[tuple[str, ...]] = ("strict", "final", "all-leaves")
"""The implicit-export policies (the same names as ``relaxtrio.forest._policy.EXPORT_POLICIES``;
config does not import the forest)."""


TERM_GRACE_S: Final = 5.0

AGENT_TIMEOUT_S: Final = 1800.0
"""Default active-time budget of a Session, seconds (the contract's reference value); training's
and the doctor's ``--agent-timeout`` both default to it, so the doctor's hold estimate matches
the run it stands for."""

RESERVED_ENV_PREFIX: Final = "RELAX_"


@attrs.frozen(kw_only=True)
class AgentConfig:
    """How to start the user's agent harness.

    Attributes:
        command: shell command, run as ``bash -lc <command>``.
        cwd: working directory; must exist.
        env: extra environment entries (no ``RELAX_`` keys).
        timeout_s: active-time budget per Session, in seconds (> 0).
        first_request_timeout_s: seconds an agent may run before its first model request
            (from its process start; > 0); past that it is stopped and its Session fails.
            None: no limit (an agent stuck before its first request then holds its Group at
            the first-request barrier for ever).
        term_grace_s: seconds between SIGTERM and SIGKILL of the process group.
        export_policy: what implicit export trains when the agent's requests left several
            leaves: ``strict`` (exactly one leaf, the default), ``final`` (the lineage ending in
            the Session's last response; other leaves are logged and counted) or ``all-leaves``
            (every leaf a context; needs a custom advantage function)
            (docs/export-and-credit.md#export-policies).
        launcher: runs one agent (the signature of :func:`relaxtrio.nursery.agent.run_agent`);
            None: a local subprocess. ``--agent-executor ray`` sets the run's Ray agent pool
            (:meth:`relaxtrio.cluster.agents.RayAgentPool.run_agent`).
        failed_log_dir: where the log (stdout + stderr) of an agent whose Session failed is
            kept, as ``<group id>_session<index>.log``; None: logs go with the Session's IO
            directory (only the last 8 KiB survive, in the failure reason).

    Raises:
        ConfigError: a blank command, a missing ``cwd``, a timeout that is not a positive
            number (either one), or a reserved ``RELAX_`` key in ``env`` (messages name the flag).
    """

    command: str
    cwd: Path = attrs.field(converter=Path)
    env: Mapping[str, str] = attrs.field(factory=dict)
    timeout_s: float = AGENT_TIMEOUT_S
    first_request_timeout_s: float | None = 600.0
    term_grace_s: float = TERM_GRACE_S
    export_policy: ExportPolicyName = "strict"
    launcher: Callable[..., Any] | None = attrs.field(default=None, eq=False)
    failed_log_dir: Path | None = None

    def __attrs_post_init__(self) -> None:
        if self.export_policy not in EXPORT_POLICY_NAMES:
            raise ConfigError(
                f"--agentic-export-policy must be one of {', '.join(EXPORT_POLICY_NAMES)}, "
                f"got {self.export_policy!r}.", param="agentic_export_policy")
        if not self.command.strip():
            raise ConfigError("--agent-command must not be blank.", param="agent_command")
        if not self.cwd.is_dir():
            raise ConfigError(
                f"--agent-cwd {str(self.cwd)!r} is not an existing directory.", param="agent_cwd"
            )
        if not (is_real(self.timeout_s) and self.timeout_s > 0):
            raise ConfigError("--agent-timeout must be a positive number of seconds.",
                              param="agent_timeout")
        first = self.first_request_timeout_s
        if first is not None and not (is_real(first) and first > 0):
            raise ConfigError("--agent-first-request-timeout must be a positive number of seconds "
                              "(0 on the command line: no limit).",
                              param="agent_first_request_timeout")
        for key in self.env:
            if key.startswith(RESERVED_ENV_PREFIX):
                raise ConfigError(
                    f"--agent-env does not allow reserved key {key!r}.", param="agent_env"
                )
