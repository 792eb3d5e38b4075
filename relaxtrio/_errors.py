"""The one error hierarchy of relaxtrio.

::

    RelaxError(Exception)                        500 internal_error / api_error
    ├── InvalidRequestError(RelaxError, ValueError)   400 invalid_request_error (carries ``param``)
    │   └── ContextLengthExceededError               400 code context_length_exceeded
    ├── AuthenticationError                      401 authentication_error
    │   └── UnknownSessionError                  401 the credential names no live Session
    │                                            (code session_discarded)
    ├── NotFoundError                            404 not_found_error (an unknown route)
    ├── SessionAbortedError                      404 the Session ended while a request waited
    ├── ClientDisconnectError                    499 client_disconnect
    ├── BackendError                             500 the generation engine failed
    │   ├── EngineUnavailableError               the engine is broken: unreachable, 5xx, or broke
    │   │   │                                    the protocol (carries ``engine_url``, ``status_code``)
    │   │   └── BackendTimeoutError              the engine did not answer in time
    │   ├── EngineRejectedError                  the engine refused this one request with a 4xx
    │   │                                        (carries ``engine_url``, ``status_code``)
    │   └── EmptyReplyError                      the model stopped before any text, reasoning or
    │                                            tool call (code empty_reply; a retry may help)
    ├── OverloadedError                          503 (OpenAI) / 529 overloaded_error (Anthropic)
    ├── InternalError                            500 a bug; never reveals details to clients
    ├── AgentExecutionError                      an agent process timed out, crashed or wrote bad output
    ├── ExportError                              a Session's output cannot become training samples
    │                                            (carries ``num_leaves`` for implicit export)
    ├── TrainerRankError                         a sharded trainer's rank died, timed out or failed
    │                                            (carries ``rank``, ``node``); stops the run
    └── ConfigError(RelaxError, ValueError)      a bad flag, config field or dataset row; the command
                                                 line exits with status 2 (never an HTTP answer)

Each class declares ``http_status``, ``openai_type``, ``anthropic_type`` and ``code`` (the
openai-python pattern), so the API layer renders any of them without a lookup table. Errors carry
data, never text to be parsed back: ``param`` (the request field path, e.g.
``messages[3].content``, or the config field), ``session_id``, and per class the fields above.
An error built with :meth:`RelaxError.at` also keeps its ``problem`` (the message after the path),
so :meth:`RelaxError.at_param` can report it at another path (a protocol's own field path, a
command-line flag) without rewriting text.

Callers tell errors apart by type: a turn that sees :class:`EngineUnavailableError` stops the run
(the engine is gone); :class:`EngineRejectedError` fails only that turn.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self


class RelaxError(Exception):
    """Base class of every error relaxtrio raises on purpose.

    Args:
        message: human-readable text; safe to show to a client for 4xx classes.
        param: the request field path that caused the error, or None.
        session_id: the Session the error belongs to, or None.
    """

    http_status: ClassVar[int] = 500
    openai_type: ClassVar[str] = "internal_error"
    anthropic_type: ClassVar[str] = "api_error"
    code: ClassVar[str | None] = None

    problem: str | None = None
    """The message after the path when the error was built with :meth:`at`, else None."""
    subpath: str = ""
    """The part of the message's path below ``param`` (see :meth:`at`)."""

    def __init__(self, message: str, *, param: str | None = None, session_id: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.session_id = session_id

    def __str__(self) -> str:
        return self.message

    @classmethod
    def at(cls, param: str, problem: str, *, subpath: str = "", **fields: Any) -> Self:
        """The error ``"<param><subpath> <problem>"`` with ``param`` set and the parts kept.

        Args:
            param: the field path the error belongs to.
            problem: the rest of the message, e.g. ``"must be an object, got string"``.
            subpath: a path inside the field's value that the message names (``.a.b`` for a
                bad value deep inside a JSON-string field), or empty.
            **fields: the class's other keyword arguments (``session_id``, ...).
        """
        error = cls(f"{param}{subpath} {problem}", param=param, **fields)
        error.problem = problem
        error.subpath = subpath
        return error

    def at_param(self, param: str) -> Self:
        """A copy of this error reported at ``param``.

        The message is rebuilt as ``"<param><subpath> <problem>"`` when the error was made by
        :meth:`at`; otherwise it is kept and only ``param`` changes. Every other field is kept.
        """
        moved = type(self).__new__(type(self), *self.args)
        moved.__dict__.update(self.__dict__)
        moved.param = param
        if self.problem is not None:
            moved.message = f"{param}{self.subpath} {self.problem}"
            moved.args = (moved.message,)
        return moved


class InvalidRequestError(RelaxError, ValueError):
    """A client mistake in a request body or an agent's output (HTTP 400)."""

    http_status = 400
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"
    code = None


class ContextLengthExceededError(InvalidRequestError):
    """The lineage plus the new observation (or the requested completion) does not fit the context.

    Args:
        prompt_tokens: the prompt's size in tokens, when known.
        max_context_tokens: the context window in tokens, when known (both known: Anthropic
            clients get Anthropic's own wording, :meth:`anthropic_message`).
    """

    code = "context_length_exceeded"

    def __init__(self, message: str, *, param: str | None = None, session_id: str | None = None,
                 prompt_tokens: int | None = None, max_context_tokens: int | None = None):
        super().__init__(message, param=param, session_id=session_id)
        self.prompt_tokens = prompt_tokens
        self.max_context_tokens = max_context_tokens

    def anthropic_message(self) -> str:
        """``prompt is too long: M tokens > N maximum`` (the Messages API's text, which harnesses
        match to start compaction) when both sizes are known, else the message."""
        if self.prompt_tokens is None or self.max_context_tokens is None:
            return self.message
        return f"prompt is too long: {self.prompt_tokens} tokens > {self.max_context_tokens} maximum"


class AuthenticationError(RelaxError):
    """Missing or malformed ``Authorization: Bearer <RELAX_SESSION_ID>`` header (HTTP 401)."""

    http_status = 401
    openai_type = "authentication_error"
    anthropic_type = "authentication_error"


class UnknownSessionError(AuthenticationError):
    """The bearer token names no live Session: unknown, finished or discarded (HTTP 401).

    An authentication failure, not a 404: harness CLIs read a 404 as a wrong model name
    (Claude Code) or retry it (Codex), while a 401 makes them stop with an auth error
    (docs/agent-contract.md#authentication).
    """

    code = "session_discarded"


class NotFoundError(RelaxError):
    """An unknown route (HTTP 404); an unknown Session is :class:`UnknownSessionError`."""

    http_status = 404
    openai_type = "not_found_error"
    anthropic_type = "not_found_error"
    code = None


class SessionAbortedError(RelaxError):
    """The Session finished or was dropped while this request was still waiting (HTTP 404)."""

    http_status = 404
    openai_type = "not_found_error"
    anthropic_type = "not_found_error"
    code = "session_discarded"


class ClientDisconnectError(RelaxError):
    """The client went away before the body was read or the answer was produced (HTTP 499)."""

    http_status = 499
    openai_type = "client_disconnect"
    anthropic_type = "invalid_request_error"
    code = "client_disconnect"


class BackendError(RelaxError):
    """The generation engine answered with an error or broke the protocol (HTTP 500 to agents)."""

    http_status = 500
    openai_type = "internal_error"
    anthropic_type = "api_error"
    code = "internal_error"


class EngineUnavailableError(BackendError):
    """The engine itself is broken: unreachable, a 5xx after retries, or a protocol violation.

    Every later turn would fail the same way, so the rollout stops the run on the first one.

    Attributes:
        engine_url: base URL of the engine, when known.
        status_code: the HTTP status it answered, or None (transport failure, bad body).
    """

    def __init__(self, message: str, *, engine_url: str | None = None, status_code: int | None = None,
                 param: str | None = None, session_id: str | None = None):
        super().__init__(message, param=param, session_id=session_id)
        self.engine_url = engine_url
        self.status_code = status_code


class BackendTimeoutError(EngineUnavailableError):
    """The generation engine did not answer within its bounded wait."""


class EngineRejectedError(BackendError):
    """The engine refused this one request (an HTTP 4xx other than context length).

    The request was at fault (e.g. an image the model cannot take), not the engine: only this
    turn fails.

    Attributes:
        engine_url: base URL of the engine that answered.
        status_code: the HTTP status (or the status of a ``success: false`` answer).
    """

    def __init__(self, message: str, *, engine_url: str, status_code: int,
                 param: str | None = None, session_id: str | None = None):
        super().__init__(message, param=param, session_id=session_id)
        self.engine_url = engine_url
        self.status_code = status_code


class EmptyReplyError(BackendError):
    """The model's reply decodes to nothing: no text, no reasoning and no tool call (its first
    token was a stop token, for instance). Nothing is committed, since an empty assistant message
    could not be echoed back (docs/canonical-contract.md).

    Only this turn fails, and unlike other 500s a retry may succeed: the retry samples again
    (the same reply when sampling is seeded; docs/agent-contract.md#errors).
    """

    openai_type = "server_error"
    code = "empty_reply"


class OverloadedError(RelaxError):
    """Temporarily unable to serve; the client may retry (503 OpenAI, 529 Anthropic)."""

    http_status = 503
    openai_type = "server_error"
    anthropic_type = "overloaded_error"


class InternalError(RelaxError):
    """A bug or an unexpected state. Rendered as a generic 500 that reveals no internals."""

    http_status = 500
    openai_type = "internal_error"
    anthropic_type = "api_error"
    code = "internal_error"


class AgentExecutionError(RelaxError):
    """An agent process timed out, exited non-zero, or wrote output that cannot be parsed.

    The message ends with the last 8 KiB of the agent's combined stdout and stderr.

    Attributes:
        return_code: the agent's exit code when it exited non-zero (negative: killed by that
            signal), else None.
        timed_out: whether the agent ran out of active time.
    """

    def __init__(self, message: str, *, session_id: str | None = None, return_code: int | None = None,
                 timed_out: bool = False):
        super().__init__(message, session_id=session_id)
        self.return_code = return_code
        self.timed_out = timed_out


class ExportError(RelaxError):
    """A Session's output cannot be turned into training samples (the Session is dropped).

    Attributes:
        num_leaves: for "implicit export requires one committed leaf", how many committed
            leaves with a response the forest had (0: the agent got no answer; > 1: several
            separate conversations); None for every other export failure.
    """

    def __init__(self, message: str, *, num_leaves: int | None = None, param: str | None = None,
                 session_id: str | None = None):
        super().__init__(message, param=param, session_id=session_id)
        self.num_leaves = num_leaves


class TrainerRankError(RelaxError):
    """A rank of the sharded trainer died, failed or stopped answering; the run stops.

    Attributes:
        rank: the rank that failed first (``0 <= rank < W``).
        node: the node it ran on (host name or Ray node id).
    """

    def __init__(self, message: str, *, rank: int, node: str):
        super().__init__(message)
        self.rank = rank
        self.node = node

class CheckpointError(RelaxError):
    """A run checkpoint could not be written (a full disk, no permission); the run stops with
    exit status 1, and the message says whether the previous checkpoint is intact."""


class ConfigError(RelaxError, ValueError):
    """A bad command-line flag, config field or dataset row (the CLI exits with status 2).

    Raised before or between steps, never answered over HTTP: a client mistake in a request is
    an :class:`InvalidRequestError` instead. A ``ValueError``, so attrs validators may raise it.
    ``param`` names the field or flag (``micro_batch_size``, ``--agent-env``).
    """
