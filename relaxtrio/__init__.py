"""relaxtrio: train an LLM through the agent applications people already have.

Each dataset sample becomes a Session: relaxtrio starts the user's unmodified agent as a subprocess,
serves it OpenAI / Anthropic compatible model endpoints, generates every reply token-in/token-out,
records every committed conversation state in a SessionForest, and turns the exported contexts into
training samples for a torch GRPO/PPO trainer.
"""

from ._errors import AgentExecutionError as AgentExecutionError
from ._errors import AuthenticationError as AuthenticationError
from ._errors import UnknownSessionError as UnknownSessionError
from ._errors import BackendError as BackendError
from ._errors import BackendTimeoutError as BackendTimeoutError
from ._errors import CheckpointError as CheckpointError
from ._errors import ClientDisconnectError as ClientDisconnectError
from ._errors import ConfigError as ConfigError
from ._errors import ContextLengthExceededError as ContextLengthExceededError
from ._errors import EmptyReplyError as EmptyReplyError
from ._errors import EngineRejectedError as EngineRejectedError
from ._errors import EngineUnavailableError as EngineUnavailableError
from ._errors import ExportError as ExportError
from ._errors import TrainerRankError as TrainerRankError
from ._errors import InternalError as InternalError
from ._errors import InvalidRequestError as InvalidRequestError
from ._errors import NotFoundError as NotFoundError
from ._errors import OverloadedError as OverloadedError
from ._errors import RelaxError as RelaxError
from ._errors import SessionAbortedError as SessionAbortedError

__version__ = "0.1.0"

__all__ = [
    "AgentExecutionError",
    "AuthenticationError",
    "UnknownSessionError",
    "BackendError",
    "BackendTimeoutError",
    "CheckpointError",
    "ClientDisconnectError",
    "ConfigError",
    "ContextLengthExceededError",
    "EmptyReplyError",
    "EngineRejectedError",
    "EngineUnavailableError",
    "ExportError",
    "TrainerRankError",
    "InternalError",
    "InvalidRequestError",
    "NotFoundError",
    "OverloadedError",
    "RelaxError",
    "SessionAbortedError",
]
