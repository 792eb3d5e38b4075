"""The run's inference side: launch or connect the fleet, and push each new weight version to it.

:func:`open_inference` turns a :class:`~relaxtrio.config.FleetConfig` into a running
:class:`~relaxtrio.fleet.fleet.EngineFleet` with :func:`relaxtrio.fleet.connect.open_fleet` (the
same code ``serve`` and ``doctor`` open their engines with): a gateway URL or worker URLs are
connected to; otherwise ``num_engines`` engines (and the gateway when more than one) are
launched, logging to ``<run dir>/engines``, through the given starter (here by default; as Ray
actors for a Ray run, :class:`relaxtrio.cluster.engines.RayEngineStarter`).

It also picks the weight store (``--weight-sync``), per worker: ``shm`` (the shared-memory
mailbox) reaches only relaxtrio embedded engines on this machine (a loopback URL), ``disk``
(version directories under the absolute ``--weights-dir``, default ``<run dir>/weights``, which
must be storage every node sees) reaches every worker. ``auto`` uses ``shm`` when every worker
is a local embedded engine, ``disk`` when none is, and both when the fleet is mixed (embedded
engines launched as Ray actors, some on the driver's node and some elsewhere): each version is
then written to both and each worker is handed the one it can read (a worker that joins later
under another URL gets the directory). :meth:`Inference.push` writes a version and brings every
worker to it, and returns the seconds it took.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import torch
import trio

from .._errors import BackendError, ConfigError
from ..config import FleetConfig
from ..fleet.connect import open_fleet
from ..fleet.fleet import EngineFleet
from ..fleet.launch_fleet import LaunchedFleet
from ..fleet.starter import EngineStarter
from ..nursery.session import Session, SessionRegistry
from ..train.weight_store import (
    DiskWeightStore,
    ShmWeightStore,
    WeightStore,
    open_weight_store,
)

__all__ = ["Inference", "LifecycleRegistry", "SplitWeightStore", "open_inference"]

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
        pause_seconds: of each push, the seconds from pausing the workers to continuing them
            (the update alone, without writing the weights).
    """

    fleet: EngineFleet
    store: WeightStore | SplitWeightStore
    launched: LaunchedFleet | None = None
    sync_seconds: list[float] = attrs.field(factory=list)
    pause_seconds: list[float] = attrs.field(factory=list)

    async def push(self, model: torch.nn.Module, version: str, *,
                   state_dict: Callable[[], Mapping[str, torch.Tensor]] | None = None) -> float:
        """Write ``model``'s weights as ``version`` and load them on every worker.

        Args:
            model: the model whose weights (and config) the engines load.
            version: the weight version label.
            state_dict: computes the tensors to write instead of ``model``'s own, in its layout
                (called in the writing thread): a LoRA trainer's merged weights, with ``model``
                its base model (:meth:`relaxtrio.train.Trainer.engine_weights`).

        Returns:
            Seconds taken, writing included.

        Raises:
            BackendError: too few workers could take the new version.

        Cancellation:
            Writing finishes in its thread; the update is shielded (workers never stay paused).
        """
        def write() -> str:
            tensors = None if state_dict is None else state_dict()
            return self.store.write(model, version, state_dict=tensors)

        return await self._push(write, version)

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
        store = self.store
        paused_at = time.perf_counter()
        await self.fleet.update_weights(
            store.route(path) if isinstance(store, SplitWeightStore) else path, version)
        self.pause_seconds.append(time.perf_counter() - paused_at)
        await trio.to_thread.run_sync(store.retire, path)
        seconds = time.perf_counter() - start
        self.sync_seconds.append(seconds)
        log.info("weights %s on %d worker(s) via %s in %.2f s", version, len(self.fleet.urls),
                 store.kind, seconds)
        return seconds


class SplitWeightStore:
    """Shared memory for the local embedded engines, a directory for every other worker.

    Each version is written to both; :meth:`route` tells the fleet which one each worker
    loads. A sharded trainer writes only to disk (see :meth:`Inference.push_saved`), so
    ``--weight-sync auto`` with one means ``disk``.

    Args:
        shm: the mailbox.
        disk: the shared directory store.
        local_urls: the workers that are embedded engines on this machine.
    """

    kind = "shm+disk"

    def __init__(self, shm: ShmWeightStore, disk: DiskWeightStore, local_urls: frozenset[str]) -> None:
        self.shm = shm
        self.disk = disk
        self.local_urls = local_urls
        self._manifest = ""

    def write(self, model: torch.nn.Module, version: str, *,
              state_dict: Mapping[str, torch.Tensor] | None = None) -> str:
        """Write ``version`` to both stores; returns the directory (the manifest is kept)."""
        self._manifest = self.shm.write(model, version, state_dict=state_dict)
        return self.disk.write(model, version, state_dict=state_dict)

    def route(self, directory: str) -> Callable[[str], str]:
        """Worker URL → what it loads: the manifest for a local embedded engine, else
        ``directory``."""
        manifest, local = self._manifest, self.local_urls
        return lambda url: manifest if url.rstrip("/") in local else directory

    def retire(self, current: str) -> None:
        """Drop the older directories (the mailbox holds one version)."""
        self.disk.retire(current)

    def close(self) -> None:
        """Remove both."""
        try:
            self.shm.close()
        finally:
            self.disk.close()


async def _local_embedded(fleet: EngineFleet) -> frozenset[str]:
    """The workers that are relaxtrio embedded engines on this machine (loopback URLs)."""
    local = set()
    for url in fleet.urls:
        if urlsplit(url).hostname not in _LOOPBACK:
            continue
        try:
            info: dict[str, Any] = await fleet.server_info(url)
        except BackendError:
            continue
        if info.get("frontend") == "relaxtrio":
            local.add(url)
    return frozenset(local)


@asynccontextmanager
async def open_inference(
    config: FleetConfig,
    *,
    model_dir: Path,
    run_dir: Path,
    engine_args: tuple[str, ...] = (),
    starter: EngineStarter | None = None,
) -> AsyncIterator[Inference]:
    """Launch or connect the fleet and open the weight store.

    Args:
        config: the fleet settings.
        model_dir: the policy model (what launched engines serve).
        run_dir: the run directory (engine logs, default weights directory).
        engine_args: extra flags of launched embedded engines.
        starter: where launched engines run (default: processes on this machine).

    Yields:
        The run's :class:`Inference`.

    Raises:
        BackendError: an engine or the gateway failed to start, no worker is reachable, or
            (cancelling the body) the fleet can no longer serve.
        ConfigError: ``weight_sync="shm"`` with workers that are not local embedded engines, or
            a connected engine that serves another model than ``model_dir``.

    Cancellation:
        Leaving stops every launched process and removes the weight store's files.
    """
    async with AsyncExitStack() as stack:
        opened = await stack.enter_async_context(open_fleet(
            config, model_dir=model_dir, log_dir=run_dir / "engines", engine_args=engine_args,
            starter=starter))
        fleet = opened.fleet
        kind = config.weight_sync
        local = await _local_embedded(fleet)
        every = bool(fleet.urls) and local == frozenset(fleet.urls)
        if kind == "shm" and not every:
            raise ConfigError("--weight-sync shm needs every worker to be a relaxtrio embedded "
                              "engine on this machine", param="--weight-sync")
        root = config.weights_dir or (run_dir / "weights").resolve()
        store: WeightStore | SplitWeightStore
        if kind == "auto" and local and not every:
            store = SplitWeightStore(ShmWeightStore(), DiskWeightStore(root), local)
            log.info("weights reach the %d engine(s) on this machine via shm, the other %d via "
                     "disk (%s)", len(local), len(fleet.urls) - len(local), root)
        else:
            if kind == "auto":
                kind = "shm" if every else "disk"
            store = open_weight_store(kind, root)
            log.info("weights reach the engines via %s%s", kind,
                     f" ({root})" if kind == "disk" else f" ({getattr(store, 'directory', '')})")
        stack.callback(store.close)
        yield Inference(fleet=fleet, store=store, launched=opened.launched)
