"""Where a fleet's generations go, and the ones in flight.

Direct mode (no gateway): a Session's first request goes to the worker holding the fewest
Sessions, and every later one to the same worker (its prefix cache holds the Session's history);
a request without a routing key goes to the worker with the fewest generations in flight.
Through a gateway the routing key travels as a header and the gateway pins it
(:mod:`relaxtrio.fleet.gateway`); only the keys sent are remembered (for ``close_session``).

Request ids: the rollout's rids end in ``#`` and contain no other ``#``, so none is a prefix of
another (SGLang aborts by prefix: docs/client-quirks.md#abort-matches-rid-prefixes); they
contain the Session id, which is unique, so they are unique across workers.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
import trio

from .._errors import EngineUnavailableError
from .engine_api import GenerateResult
from .members import Membership, Worker

__all__ = ["Flight", "SessionRoutes", "check_rid", "lost_result"]


def check_rid(rid: str) -> None:
    """Refuse a request id that could be a prefix of another one (SGLang aborts by prefix).

    Raises:
        ValueError: ``rid`` does not end in ``#`` or has another ``#`` inside.
    """
    if not rid.endswith("#") or "#" in rid[:-1]:
        raise ValueError(f"request id {rid!r} must end in '#' and contain no other '#'")


def lost_result(rid: str, reason: str, weight_version: str) -> GenerateResult:
    """The answer of a generation whose worker went away: an abort with no output."""
    meta = {"id": rid, "finish_reason": {"type": "abort", "message": reason},
            "completion_tokens": 0, "weight_version": weight_version}
    return GenerateResult(
        output_ids=(), output_logprobs=(), finish_type="abort", finish_matched=None,
        prompt_tokens=None, completion_tokens=0, cached_tokens=None,
        weight_version=weight_version, weight_versions=(), text="", meta_info=meta,
    )


@attrs.define(eq=False)
class Flight:
    """One generation in flight.

    Attributes:
        rid: its request id.
        worker: where it runs, or None when sent through the gateway.
        started: trio clock time it was sent.
        scope: cancelled when it is lost.
        lost: why it was lost (its worker left), or None.
    """

    rid: str
    worker: Worker | None
    started: float
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    lost: str | None = None

    def lose(self, reason: str) -> None:
        """End the generation at once as lost (its caller resumes it elsewhere)."""
        if self.lost is None:
            self.lost = reason
            self.scope.cancel()


@attrs.define(eq=False)
class SessionRoutes:
    """Which worker serves each Session (direct mode), and which keys went to the gateway.

    Attributes:
        by_session: Session id → base URL of its worker.
        gateway_keys: routing keys sent through the gateway and not yet ended.
    """

    by_session: dict[str, str] = attrs.field(factory=dict)
    gateway_keys: set[str] = attrs.field(factory=set)

    def route(self, members: Membership, key: str | None, flights: Iterable[Flight]) -> Worker:
        """The worker of a generation with routing key ``key`` (see the module docstring).

        Raises:
            EngineUnavailableError: no healthy worker (the fleet's error when it failed).
        """
        live = members.live
        if not live:
            members.check_quorum()
            raise EngineUnavailableError("no healthy engine to generate on")
        if key is None:
            load = dict.fromkeys(live, 0)
            for flight in flights:
                if flight.worker is not None and flight.worker.url in load:
                    load[flight.worker.url] += 1
            return live[min(load, key=load.__getitem__)]
        url = self.by_session.get(key)
        if url is not None and url in live:
            return live[url]
        worker = min(live.values(), key=lambda w: len(w.sessions))
        worker.sessions.add(key)
        self.by_session[key] = worker.url
        return worker

    def worker_left(self, worker: Worker) -> None:
        """Forget the Sessions of a removed worker (their next request picks another)."""
        for session_id in worker.sessions:
            self.by_session.pop(session_id, None)

    def end(self, members: Membership, session_id: str) -> tuple[Worker | None, bool]:
        """Forget where ``session_id`` went; returns its worker if still healthy (direct mode)
        and whether it went through the gateway."""
        url = self.by_session.pop(session_id, None)
        through_gateway = session_id in self.gateway_keys
        self.gateway_keys.discard(session_id)
        worker = members.live.get(url) if url is not None else None
        if worker is not None:
            worker.sessions.discard(session_id)
        return worker, through_gateway

    def knows(self, session_id: str) -> bool:
        """Whether ``session_id`` was routed and not yet ended."""
        return session_id in self.by_session or session_id in self.gateway_keys
