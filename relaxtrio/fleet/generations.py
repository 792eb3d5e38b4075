"""A fleet's generations in flight: where each is sent, and what happens when its worker is lost.

A generation is sent to its Session's worker (direct mode, :class:`~.routing.SessionRoutes`) or
through the gateway with the routing-key header. When its worker is removed it ends at once as
lost: an abort with no output (:func:`~.routing.lost_result`), which the turn code resumes like
any partial rollout, on another worker. A generation that fails on its worker, or through the
gateway, is handled the same way after the fleet checked its workers. Through the gateway the
fleet does not know which worker runs a generation: when one is removed, every generation in
flight is aborted on the remaining workers (those return their partial output), and whichever
still runs :data:`ABORT_GRACE_S` later was on the removed worker and is ended as lost.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import trio

from .._errors import BackendError
from .engine_api import EngineAPI, GenerateResult, SamplingParams
from .gateway import ROUTING_KEY_HEADER
from .health import HealthMonitor
from .members import Membership, Worker, worker_failure
from .routing import Flight, SessionRoutes, lost_result

__all__ = ["ABORT_GRACE_S", "Generations"]

log = logging.getLogger("relaxtrio.fleet.fleet")

ABORT_GRACE_S: Final = 5.0
"""Seconds an abort of a failed or orphaned generation may take (shielded)."""


class Generations:
    """The generations of one fleet.

    Attributes:
        flights: request id → the generation in flight.

    Args:
        members: the fleet's membership.
        routes: where each Session's generations go (direct mode).
        monitor: checks the workers after a failed generation.
        abort: the fleet's abort (every worker).
        nursery: where orphaned generations are reclaimed.
        gateway_client: the client of the gateway (gateway mode), or None.
    """

    def __init__(self, *, members: Membership, routes: SessionRoutes, monitor: HealthMonitor,
                 abort: Callable[[str], Awaitable[None]], nursery: trio.Nursery,
                 gateway_client: EngineAPI | None):
        self.flights: dict[str, Flight] = {}
        self._members = members
        self._routes = routes
        self._monitor = monitor
        self._abort = abort
        self._nursery = nursery
        self._gateway_client = gateway_client

    async def run(self, input_ids: Sequence[int], sampling: SamplingParams, *, rid: str,
                  key: str | None, session_id: str | None, return_logprob: bool,
                  image_data: Sequence[str] | None, prefix_key: str | None) -> GenerateResult:
        """Send one generation (``rid`` checked and not in flight) with routing key ``key``.

        Returns / Raises / Cancellation: as :meth:`relaxtrio.fleet.fleet.EngineFleet.generate`.
        """
        self._raise_if_failed()
        await self._members.wait_servable()  # every worker is being restarted (or re-registered)
        self._raise_if_failed()
        worker, client, headers = self._target(key)
        flight = Flight(rid=rid, worker=worker, started=trio.current_time())
        self.flights[rid] = flight
        failure: BackendError | None = None
        try:
            with flight.scope:
                try:
                    return await client.generate(
                        input_ids, sampling, rid=rid, return_logprob=return_logprob,
                        session_id=session_id, image_data=image_data, headers=headers,
                        prefix_key=prefix_key)
                except BackendError as exc:
                    if not worker_failure(exc):
                        raise
                    failure = exc
        finally:
            del self.flights[rid]
        if flight.lost is None:
            assert failure is not None
            await self._after_failure(flight, failure)
        self._raise_if_failed()
        log.warning("fleet: request %s resumes on %s (%s)", rid,
                    "another worker" if self._members.live else "the next worker available",
                    flight.lost)
        assert flight.lost is not None
        return lost_result(rid, flight.lost, self._members.version or "default")

    def _raise_if_failed(self) -> None:
        if self._members.fatal is not None:
            raise self._members.fatal

    def _target(self, key: str | None) -> tuple[Worker | None, EngineAPI, dict[str, str] | None]:
        """Where a generation with routing key ``key`` goes: (its worker, or None through the
        gateway; the client to call; extra headers)."""
        if self._gateway_client is None:
            worker = self._routes.route(self._members, key, self.flights.values())
            return worker, worker.generation_client, None
        if key is None:
            return None, self._gateway_client, None
        self._routes.gateway_keys.add(key)
        return None, self._gateway_client, {ROUTING_KEY_HEADER: key}

    async def _after_failure(self, flight: Flight, failure: BackendError) -> None:
        """A generation failed on its worker (or the gateway): check the fleet, abort the rid
        wherever it may still run, and mark the flight lost."""
        worker = flight.worker
        gateway = self._gateway_client
        if worker is not None:
            where = worker.url
        else:
            where = f"gateway {gateway.url}" if gateway is not None else "no worker"
        log.warning("fleet: generation %s failed on %s: %s", flight.rid, where, failure)
        await self._monitor.recover(worker, failure, flight.started)
        with trio.CancelScope(shield=True), trio.move_on_after(ABORT_GRACE_S):
            try:
                await self._abort(flight.rid)  # it may still run somewhere; free that worker
            except BackendError:
                pass
        flight.lost = f"generation failed: {failure}"

    def worker_left(self, worker: Worker, reason: str) -> None:
        """``worker`` was removed: its generations end as lost now; through the gateway, every
        generation in flight is reclaimed (see the module docstring)."""
        for flight in list(self.flights.values()):
            if flight.worker is worker:
                flight.lose(f"worker {worker.url} removed: {reason}")
        orphans = [f for f in self.flights.values() if f.worker is None]
        if orphans:  # through the gateway we do not know which worker ran them
            self._nursery.start_soon(self._reclaim, orphans, worker.url)

    async def _reclaim(self, flights: Sequence[Flight], removed_url: str) -> None:
        for rid in [f.rid for f in flights if f.lost is None]:
            try:
                await self._abort(rid)
            except BackendError as exc:
                log.warning("fleet: abort of %s failed: %s", rid, exc)
        await trio.sleep(ABORT_GRACE_S)
        for flight in flights:
            if self.flights.get(flight.rid) is flight:
                flight.lose(f"its worker may have been {removed_url}, which was removed")
