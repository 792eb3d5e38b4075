"""The fleet a command runs on: launched engines, or the engines at given URLs.

``train``, ``rollout``, ``serve`` and ``doctor`` all open their engines with :func:`open_fleet`,
so every command generates through the same :class:`~relaxtrio.fleet.fleet.EngineFleet` (a
fleet of one where there is one engine):

- with a gateway URL (``router_url``) or worker URLs (``engine_urls``) the fleet connects to
  them, after refusing engines that serve another model than the run's
  (:func:`relaxtrio.models.refuse_other_served_models`);
- otherwise ``num_engines`` engines (and the gateway when more than one) are launched and
  supervised (:func:`~relaxtrio.fleet.launch_fleet.open_launched_fleet`), and the fleet is told
  about their deaths and restarts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import attrs

from ..config import FleetConfig
from ..models import refuse_other_served_models
from ..sglang.client import open_connections as open_sglang_connections
from .engine_api import OpenConnections
from .fleet import EngineFleet, open_engine_fleet
from .launch_fleet import EngineKind, LaunchedFleet, open_launched_fleet
from .starter import EngineStarter

__all__ = ["OpenedFleet", "open_fleet"]


@attrs.frozen
class OpenedFleet:
    """What :func:`open_fleet` opened.

    Attributes:
        fleet: the workers (what the turn code generates with).
        launched: the launched processes, or None when connected to given URLs.
    """

    fleet: EngineFleet
    launched: LaunchedFleet | None


@asynccontextmanager
async def open_fleet(
    config: FleetConfig,
    *,
    model_dir: Path,
    log_dir: Path,
    engine_args: Sequence[str] = (),
    kind: EngineKind | None = None,
    starter: EngineStarter | None = None,
    open_connections: OpenConnections = open_sglang_connections,
) -> AsyncIterator[OpenedFleet]:
    """Launch or connect the engines of ``config`` and open the fleet over them.

    Args:
        config: the fleet settings (``launches`` says which of the two).
        model_dir: the policy model: what launched engines serve, and what connected ones must.
        log_dir: where launched engines and the gateway log (``engine-<i>.log``,
            ``gateway.log``).
        engine_args: extra flags of launched embedded engines.
        kind: the kind of launched engines (default: SGLang where it and a GPU are present,
            else embedded; :func:`~relaxtrio.fleet.launch_fleet.detect_engine_kind`).
        starter: where launched engines run (default: processes on this machine).
        open_connections: the workers' wire protocol (default: SGLang's native API).

    Yields:
        The fleet, and what was launched.

    Raises:
        BackendError: an engine or the gateway failed to start, no worker is reachable, or
            (cancelling the body) the fleet can no longer serve.
        ConfigError: a connected engine serves another model than ``model_dir``.

    Cancellation:
        Leaving stops the monitor and every launched process (shielded).
    """
    async with AsyncExitStack() as stack:
        launched = None
        gateway_url, worker_urls = config.router_url, config.engine_urls
        if config.launches:
            launched = await stack.enter_async_context(open_launched_fleet(
                config, model_dir=model_dir, log_dir=log_dir, engine_args=engine_args, kind=kind,
                starter=starter))
            gateway_url = launched.gateway_url
            worker_urls = () if gateway_url else launched.worker_urls
        fleet = await stack.enter_async_context(open_engine_fleet(
            config, worker_urls=worker_urls, gateway_url=gateway_url,
            expect_urls=launched.worker_urls if launched else (),
            open_connections=open_connections))
        if launched is not None:
            launched.attach(fleet)
        else:
            await refuse_other_served_models(fleet.model_info, fleet.urls, model_dir)
        yield OpenedFleet(fleet=fleet, launched=launched)
