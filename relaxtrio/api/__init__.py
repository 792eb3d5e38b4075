"""relaxtrio.api: the agent-facing model APIs (Chat Completions, Responses, Anthropic Messages).

Requests of every protocol are normalized to one canonical turn, run in the Session's nursery,
and rendered back in the request's protocol as JSON or Buffered SSE.
"""

from ..config import ApiConfig as ApiConfig
from .app import ROUTE_PREFIX as ROUTE_PREFIX
from .app import create_app as create_app
from .app import serve_api as serve_api

__all__ = ["ROUTE_PREFIX", "ApiConfig", "create_app", "serve_api"]
