"""The run's inference side: launch or connect the fleet, and push each new weight version to it.

:func:`open_inference` turns a :class:`~relaxtrio.config.FleetConfig` into a running
:class:`~relaxtrio.sglang.fleet.EngineFleet`:

- a gateway URL or worker URLs are connected to;
- otherwise ``num_engines`` engines (and the gateway when more than one) are launched by
  :func:`~relaxtrio.sglang.launch_fleet.open_launched_fleet`, logging to ``<run dir>/engines``.

It also picks the weight store (``--weight-sync``): ``shm`` (the shared-memory mailbox) only
when every worker is a relaxtrio embedded engine on this machine, ``disk`` (version directories
under the absolute ``--weights-dir``, default ``<run dir>/weights``) otherwise.
:meth:`Inference.push` writes a version and brings every worker to it, and returns the seconds
it took.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import torch
import trio

from ._errors import BackendError, ConfigError
from .config import FleetConfig
from .nursery.session import Session, SessionRegistry
from .sglang.fleet import EngineFleet, open_engine_fleet
from .sglang.launch_fleet import LaunchedFleet, open_launched_fleet
from .train.weight_store import DiskWeightStore, WeightStore, open_weight_store

__all__ = ["Inference", "LifecycleRegistry", "open_inference"]

log = logging.getLogger(__name__)

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@attrs.define(eq=False)
class LifecycleRegistry(SessionRegistry):
    """A :class:`SessionRegistry` that reports each Session's end (its ``discard``) to a callback.

    Attributes:
        on_end: called with the Session id when the Session ends.
    """

    on_end: Callable[[str], None] | None = None

    def discard(self, session: Session) -> None:
        """Forgets the Session and reports its end."""
        super().discard(session)
        if self.on_end is not None:
            self.on_end(session.session_id)


@attrs.define(eq=False, kw_only=True)
class Inference:
    """The fleet of one run and where its weights go.

    Attributes:
        fleet: the workers (the turn handler's ``client``).
        store: where each version is written for the engines.
        launched: the launched processes, or None when connecting.
        sync_seconds: weight-sync seconds of every push so far (write + update of all workers).
    """

    fleet: EngineFleet
    store: WeightStore
    launched: LaunchedFleet | None = None
    sync_seconds: list[float] = attrs.field(factory=list)

    async def push(self, model: torch.nn.Module, version: str) -> float:
        """Write ``model``'s weights as ``version`` and load them on every worker.

        Returns:
            Seconds taken, writing included.

        Raises:
            BackendError: too few workers could take the new version.

        Cancellation:
            Writing finishes in its thread; the update is shielded (workers never stay paused).
        """
        return await self._push(lambda: self.store.write(model, version), version)

    async def push_saved(self, save: Callable[[Path], Path], version: str) -> float:
        """As :meth:`push`, for a trainer that writes its own weights: ``save(directory)``
        writes ``version`` (rank 0 of a sharded trainer gathers the full state dict there).

        Returns:
            Seconds taken, writing included.

        Raises:
            ConfigError: the store is the shared-memory mailbox (a sharded trainer pushes
                through the disk store).
            BackendError: too few workers could take the new version.

        Cancellation:
            As :meth:`push`.
        """
        store = self.store
        if not isinstance(store, DiskWeightStore):
            raise ConfigError("a sharded trainer pushes weights through the disk store; "
                              "use --weight-sync disk", param="--weight-sync")
        return await self._push(lambda: store.write_saved(save, version), version)

    async def _push(self, write: Callable[[], str], version: str) -> float:
        start = time.perf_counter()
        async with self.fleet.weights_lock:  # no (re)starting worker loads a half-written version
            path = await trio.to_thread.run_sync(write)
        await self.fleet.update_weights(path, version)
        await trio.to_thread.run_sync(self.store.retire, path)
        seconds = time.perf_counter() - start
        self.sync_seconds.append(seconds)
        log.info("weights %s on %d worker(s) via %s in %.2f s", version, len(self.fleet.urls),
                 self.store.kind, seconds)
        return seconds


async def _all_local_embedded(fleet: EngineFleet) -> bool:
    for url in fleet.urls:
        if urlsplit(url).hostname not in _LOOPBACK:
            return False
        try:
            info: dict[str, Any] = await fleet.server_info(url)
        except BackendError:
            return False
        if info.get("frontend") != "relaxtrio":
            return False
    return bool(fleet.urls)


@asynccontextmanager
async def open_inference(
    config: FleetConfig,
    *,
    model_dir: Path,
    run_dir: Path,
    engine_args: tuple[str, ...] = (),
) -> AsyncIterator[Inference]:
    """Launch or connect the fleet and open the weight store.

    Args:
        config: the fleet settings.
        model_dir: the policy model (what launched engines serve).
        run_dir: the run directory (engine logs, default weights directory).
        engine_args: extra flags of launched embedded engines.

    Yields:
        The run's :class:`Inference`.

    Raises:
        BackendError: an engine or the gateway failed to start, no worker is reachable, or
            (cancelling the body) the fleet can no longer serve.
        ConfigError: ``weight_sync="shm"`` with workers that are not local embedded engines.

    Cancellation:
        Leaving stops every launched process and removes the weight store's files.
    """
    async with AsyncExitStack() as stack:
        launched = None
        gateway_url, worker_urls = config.router_url, config.engine_urls
        if config.launches:
            launched = await stack.enter_async_context(open_launched_fleet(
                config, model_dir=model_dir, log_dir=run_dir / "engines", engine_args=engine_args))
            gateway_url = launched.gateway_url
            worker_urls = () if gateway_url else launched.worker_urls
        fleet = await stack.enter_async_context(
            open_engine_fleet(config, worker_urls=worker_urls, gateway_url=gateway_url))
        if launched is not None:
            launched.attach(fleet)
        kind = config.weight_sync
        local = await _all_local_embedded(fleet)
        if kind == "shm" and not local:
            raise ConfigError("--weight-sync shm needs every worker to be a relaxtrio embedded "
                              "engine on this machine", param="--weight-sync")
        if kind == "auto":
            kind = "shm" if local else "disk"
        root = config.weights_dir or (run_dir / "weights").resolve()
        store = open_weight_store(kind, root)
        stack.callback(store.close)
        log.info("weights reach the engines via %s%s", kind,
                 f" ({root})" if kind == "disk" else f" ({getattr(store, 'directory', '')})")
        yield Inference(fleet=fleet, store=store, launched=launched)
