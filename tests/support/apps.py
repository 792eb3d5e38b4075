"""Served apps for tests: the agent API on a real socket (127.0.0.1, a free port)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from relaxtrio.api.app import create_app, serve_api


@asynccontextmanager
async def serve_app(app: Any) -> AsyncIterator[str]:
    """Serves ``app`` with hypercorn; yields its base URL (``http://127.0.0.1:<port>/agentic_api/``).

    Cancellation:
        Exiting stops the server; requests still open are cancelled.
    """
    async with trio.open_nursery() as nursery:
        yield await nursery.start(serve_api, app)
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def serve_agent_api(registry: Any, handler: Any, **app_options: Any) -> AsyncIterator[str]:
    """:func:`serve_app` of ``create_app(registry, handler, **app_options)``."""
    async with serve_app(create_app(registry, handler, **app_options)) as base_url:
        yield base_url
