"""Health of a fleet's workers: periodic probes, and the check after a failed generation.

Every ``health_interval_s`` the monitor re-reads the gateway's listing (gateway mode) and sends
each worker one ``/health`` probe (:meth:`~relaxtrio.fleet.engine_api.EngineAPI.health_status`,
one attempt bounded by ``health_timeout_s``). A refused connection removes a worker at once;
``health_failures`` failed probes in a row remove one that stopped answering. No verdict while
the fleet holds the workers paused: SGLang's probe generation waits behind a pause
(docs/client-quirks.md#health-checks-while-paused).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from .._errors import BackendError
from .gateway import Gateway
from .members import Membership, Worker, refused

__all__ = ["HealthMonitor"]


class HealthMonitor:
    """Probes the workers of one fleet.

    Args:
        members: the fleet's membership.
        gateway: the gateway whose listing is re-read before each sweep, or None.
        remove: the fleet's removal (``remove(url, reason)``).
    """

    def __init__(self, members: Membership, gateway: Gateway | None,
                 remove: Callable[[str, str], None]):
        self._members = members
        self._gateway = gateway
        self._remove = remove
        self._sweep_lock = trio.Lock()
        self._swept_at = -math.inf

    async def probe(self, worker: Worker) -> None:
        """One ``/health`` probe; removes the worker when it is gone or keeps failing.

        Cancellation:
            A checkpoint; nothing to clean up.
        """
        members = self._members
        if members.paused:
            return
        timeout_s = members.config.health_timeout_s
        try:
            status = await worker.probe.health_status()
        except BackendError as exc:
            if refused(exc):
                self._remove(worker.url, f"connection refused ({exc.__cause__!r})")
                return
            failure = f"no /health answer within {timeout_s:g} s ({exc})"
        else:
            if status == 200:
                worker.failures = 0
                return
            failure = f"/health answered HTTP {status}"
        worker.failures += 1
        if worker.failures >= members.config.health_failures:
            self._remove(worker.url, f"{failure}, {worker.failures} probes in a row")

    async def sweep(self) -> None:
        """Re-read the listing (gateway mode) and probe every worker once, concurrently.

        Skipped while the fleet holds the workers paused.

        Raises:
            EngineUnavailableError: too few workers remain, or the gateway stayed away too long.

        Cancellation:
            A checkpoint; probes already answered keep their effect.
        """
        if self._members.paused:
            return
        await self.sweep_since(trio.current_time())

    async def sweep_since(self, since: float) -> None:
        """One sweep, unless another one started at or after ``since`` (trio clock time).

        Raises:
            EngineUnavailableError: as :meth:`sweep`.
        """
        async with self._sweep_lock:
            if self._swept_at >= since:
                self._members.check_quorum()
                return
            self._swept_at = trio.current_time()
            if self._gateway is not None:
                await self._gateway.refresh()
            async with trio.open_nursery() as nursery:
                for worker in self._members.workers:
                    nursery.start_soon(self.probe, worker)
            self._members.check_quorum()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sweep every ``health_interval_s`` until cancelled.

        Raises:
            EngineUnavailableError: the fleet can no longer serve (see :meth:`sweep`).

        Cancellation:
            Runs until cancelled.
        """
        task_status.started()
        while True:
            await trio.sleep(self._members.config.health_interval_s)
            await self.sweep()

    async def recover(self, worker: Worker | None, exc: BackendError, failed_at: float) -> None:
        """After a failed generation: check its worker, or (through the gateway, ``worker``
        None) wait for the gateway and probe every worker once.

        Raises:
            EngineUnavailableError: the fleet can no longer serve.

        Cancellation:
            A checkpoint.
        """
        members = self._members
        if worker is not None:
            if refused(exc):
                self._remove(worker.url, f"connection refused ({exc.__cause__!r})")
            elif worker.url in members.live:
                await self.probe(worker)
            members.check_quorum()
            return
        if self._gateway is not None:
            await self._gateway.wait_reachable()
        await self.sweep_since(failed_at)
