"""vLLM's :class:`~relaxtrio.fleet.engine_api.EngineConnections`: the pools every
:class:`~relaxtrio.vllm.client.VllmEngineClient` of a fleet shares.

:func:`open_connections` is the ``open_connections`` a fleet of vLLM engines is opened with
(:func:`relaxtrio.fleet.connect.open_fleet` picks it for ``--rollout-backend vllm``);
:func:`open_vllm_client` opens one client on pools of its own (tests, benchmarks).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import httpx

from ..sglang._http import EngineClientConfig, open_pools
from ..sglang._pool import ConnectionPool
from .client import VllmEngineClient

__all__ = ["VllmConnections", "open_connections", "open_vllm_client"]


@attrs.define(eq=False)
class VllmConnections:
    """The generation and control pools of vLLM clients; open it with :func:`open_connections`.

    Attributes:
        generation: the pool of ``/inference/v1/generate`` traffic (all engines).
        control: the ``httpx.AsyncClient`` of control traffic (all engines).
        config: the default limits and timeouts of the clients.
        versions: the weight label last set or read per engine URL, shared by every client
            made here (a fleet holds several clients of one engine).
    """

    generation: httpx.AsyncClient | ConnectionPool
    control: httpx.AsyncClient
    config: EngineClientConfig
    versions: dict[str, str] = attrs.field(factory=dict)

    def client(self, url: str, config: EngineClientConfig | None = None) -> VllmEngineClient:
        """A client of the vLLM server at ``url`` on these pools (``config``: its timeouts and
        retries; the pool sizes are the pools'). Cheap: no I/O."""
        return VllmEngineClient(url, generation=self.generation, control=self.control,
                                config=config or self.config, versions=self.versions)


@asynccontextmanager
async def open_connections(
    config: EngineClientConfig | None = None,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AsyncIterator[VllmConnections]:
    """Open the pools that vLLM clients share (docs/client-quirks.md#control-calls-behind-generations).

    Args:
        config: pool sizes, timeouts and retry policy; defaults as in :class:`EngineClientConfig`.
        transport: a custom transport for both pools (then both are ``httpx.AsyncClient`` s);
            without one, generation goes through a :class:`~relaxtrio.sglang._pool.ConnectionPool`.

    Yields:
        The pools; both are closed on exit.

    Cancellation:
        Exiting closes the pools; in-flight calls must have finished or been cancelled.
    """
    cfg = config or EngineClientConfig()
    async with open_pools(cfg, transport) as (generation, control):
        yield VllmConnections(generation=generation, control=control, config=cfg)


@asynccontextmanager
async def open_vllm_client(
    url: str,
    *,
    config: EngineClientConfig | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AsyncIterator[VllmEngineClient]:
    """Open one :class:`VllmEngineClient` on pools of its own (:func:`open_connections`).

    Args:
        url: the vLLM server's base URL.
        config: limits, timeouts and retry policy; defaults as in :class:`EngineClientConfig`.
        transport: a custom transport for both pools.

    Yields:
        The client; its pools are closed on exit.
    """
    async with open_connections(config, transport=transport) as connections:
        yield connections.client(url)
