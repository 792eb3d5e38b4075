"""Control calls to every worker of a fleet, and the weight update bracket.

The gateway has no control routes (docs/client-quirks.md#no-abort-through-the-router), so
abort, pause, continue, weight loads, cache flushes and session closes go to every worker
(through a gateway: every worker of its listing, re-read first when older than a second). A
worker that cannot be reached is removed instead of failing the call.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import httpx
import trio

from .._errors import BackendError
from .gateway import Gateway
from .members import Membership, WeightPaths, Worker, path_for

__all__ = ["ControlFanout"]

log = logging.getLogger("relaxtrio.fleet.fleet")


class ControlFanout:
    """Runs control calls on every worker of one fleet.

    Args:
        members: the fleet's membership.
        gateway: the gateway whose listing names the workers, or None.
        remove: the fleet's removal (``remove(url, reason)``).
    """

    def __init__(self, members: Membership, gateway: Gateway | None,
                 remove: Callable[[str, str], None]):
        self._members = members
        self._gateway = gateway
        self._remove = remove

    async def workers(self) -> tuple[Worker, ...]:
        """The healthy workers, after re-reading a stale gateway listing.

        Raises:
            EngineUnavailableError: the gateway stayed away too long.
        """
        if self._gateway is not None:
            await self._gateway.fresh_listing()
        return self._members.workers

    async def each(self, call: Callable[[Worker], Awaitable[object]],
                   workers: Sequence[Worker] | None = None) -> None:
        """Run ``call`` on every worker (or on ``workers``) concurrently.

        A worker that cannot be reached (after the client's retries) is removed, and a call on a
        worker that gets removed meanwhile is cancelled: neither fails the call. Any other
        failure (an HTTP error answer) is raised after every worker was tried.

        Raises:
            BackendError: the first failure of a reachable worker.
            EngineUnavailableError: too few workers remain.

        Cancellation:
            A checkpoint; workers already reached keep the call's effect.
        """
        if workers is None:
            workers = await self.workers()
        errors: list[BackendError] = []
        live = self._members.live

        async def one(worker: Worker) -> None:
            if worker.url not in live:
                return
            scope = trio.CancelScope()
            worker.calls.add(scope)
            try:
                with scope:
                    await call(worker)
            except BackendError as exc:
                if worker.url not in live:
                    return
                if isinstance(exc.__cause__, httpx.TransportError):
                    self._remove(worker.url, f"unreachable: {exc}")
                    return
                errors.append(exc)
            finally:
                worker.calls.discard(scope)

        async with trio.open_nursery() as nursery:
            for worker in workers:
                nursery.start_soon(one, worker)
        self._members.check_quorum()
        if errors:
            raise errors[0]

    async def update_weights(self, model_path: str | WeightPaths, version: str) -> None:
        """Bring every worker to weight version ``version`` before any generates again.

        Pause every worker (``retract``: in-flight requests keep their tokens and continue on
        the new weights), load ``model_path`` on every worker, confirm each worker's weight
        version, continue every worker. A worker that fails to load or reports another version
        is continued (not left paused) and removed (it must not serve stale weights to this
        run).

        Args:
            model_path: what every worker loads, or a function giving each worker's.
            version: the new version label.

        Raises:
            EngineUnavailableError: too few workers remain.

        Cancellation:
            Shielded: the workers are never left paused.
        """
        members = self._members
        async with members.weights_lock:
            with trio.CancelScope(shield=True):
                workers = await self.workers()
                members.paused += 1
                try:
                    await self.each(lambda w: w.client.pause_generation("retract"), workers)
                    await self.each(lambda w: self._load(w, model_path, version), workers)
                    members.weights = (model_path, version)
                finally:
                    try:
                        await self.each(lambda w: w.client.continue_generation(), workers)
                    finally:
                        members.paused -= 1
        log.info("fleet: %d worker(s) at weight version %s", len(members.live), version)

    async def _load(self, worker: Worker, model_path: str | WeightPaths, version: str) -> None:
        """Load ``version`` on ``worker`` and confirm it; remove the worker when that fails."""
        try:
            await worker.client.update_weights_from_disk(path_for(model_path, worker.url),
                                                         weight_version=version)
            await self._members.verify_version(worker.client, version)
        except BackendError as exc:  # refused, failed, or another version
            # Removed ones are not continued below; one that is still up must not stay paused
            # for whoever uses it next (a connected engine outlives this run).
            with contextlib.suppress(BackendError):
                await worker.client.continue_generation()
            self._remove(worker.url, f"weight update to {version} failed: {exc}")
