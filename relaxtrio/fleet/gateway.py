"""The SGLang Model Gateway in front of a fleet's workers, seen from the fleet.

Generations go through the gateway with the header ``X-SMG-Routing-Key: <session id>``; with
its ``manual`` policy that key is pinned to one worker until the worker leaves. The gateway
(``smg`` 1.13, launched as ``smg launch``) has no abort, pause, continue or weight-update route
(docs/client-quirks.md#no-abort-through-the-router), so the fleet sends control calls to every
worker of the gateway's ``GET /workers`` listing, which :class:`Gateway` follows: new URLs join
the fleet, URLs it stops listing leave it, removed workers are deleted from it
(``DELETE /workers/<id>``, so their keys are pinned elsewhere at once), readmitted
workers are registered with it (``POST /workers``) once their old entry and its drain are gone. An
unreachable gateway is waited for up to ``gateway_wait_s`` (a restart is survived); longer,
and the fleet fails. Its per-worker counters are read per step where its metrics port is known
(:meth:`Gateway.watch_metrics`, :mod:`relaxtrio.fleet.gateway_metrics`).

Launching the gateway process is :mod:`relaxtrio.fleet.launch_fleet`'s.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs
import httpx
import trio

from .._errors import BackendError, EngineUnavailableError
from ..config import FleetConfig
from ..sglang._http import json_object, send_with_retries
from ..sglang._pool import PoolResponse
from .engine_api import EngineClientConfig
from .gateway_metrics import GatewayMetrics
from .members import JOIN_GRACE_S, Membership

__all__ = ["GATEWAY_POLL_S", "LISTING_MAX_AGE_S", "ROUTING_KEY_HEADER", "UNLISTED_GRACE_S",
           "Gateway"]

log = logging.getLogger("relaxtrio.fleet.fleet")

ROUTING_KEY_HEADER: Final = "X-SMG-Routing-Key"
"""The gateway's routing-key header (``smg``'s default, also passed to it as
``--routing-key-headers``; ``--policy manual`` pins each key to one worker)."""
LISTING_MAX_AGE_S: Final = 1.0
"""A control call re-reads the listing first when the last reading is older than this."""
UNLISTED_GRACE_S: Final = 10.0
"""Seconds a live worker may be missing from the listing before it leaves the fleet."""
GATEWAY_POLL_S: Final = 0.5
SMG_DRAIN_S: Final = 5.0
"""smg 1.13's removal drain: a ``DELETE``d entry is removed, by URL, this many seconds later
(``drain_settle_secs``; smg has no launch flag for it)."""
DRAIN_MARGIN_S: Final = 1.0
"""Seconds past :data:`SMG_DRAIN_S` before a deleted URL is registered again."""


class Gateway:
    """The gateway of one fleet: its listing, followed into :class:`Membership`.

    Args:
        url: the gateway's base URL.
        members: the fleet's membership, changed by what the listing says.
        remove: the fleet's removal (``remove(url, reason)``: ends the worker's generations).
        http: the ``httpx.AsyncClient`` of the gateway's admin calls.
        config: ``gateway_wait_s``.
        client_config: timeouts of the admin calls.
        nursery: where deletes and readmission waits run in the background.
    """

    def __init__(self, url: str, *, members: Membership, remove: Callable[[str, str], None],
                 http: httpx.AsyncClient, config: FleetConfig, client_config: EngineClientConfig,
                 nursery: trio.Nursery):
        self.url = url.rstrip("/")
        self._members = members
        self._remove = remove
        self._http = http
        self._config = config
        self._client_config = client_config
        self._nursery = nursery
        self.listed_at = -math.inf
        self.down_since: float | None = None
        self._unlisted: dict[str, float] = {}  # live URL -> since when the listing lacks it
        self._forgetting: set[str] = set()
        self._deleted: set[str] = set()  # worker ids deleted, or being deleted, once
        self._drain_ends: dict[str, float] = {}  # URL -> when smg's removal job for it fires
        self._registered: dict[str, str] = {}  # readmitted URL -> the id our POST was given
        self.metrics: GatewayMetrics | None = None

    def watch_metrics(self, metrics_url: str) -> None:
        """Read the gateway's per-worker counters from ``metrics_url`` (its Prometheus
        listener) in :meth:`step_metrics`."""
        self.metrics = GatewayMetrics(metrics_url, http=self._http,
                                      timeout_s=self._client_config.control_timeout_s)

    async def step_metrics(self) -> dict[str, float]:
        """The per-worker request and failure counts, and the errors, since the last call
        (:meth:`GatewayMetrics.read`); empty when no metrics URL is known."""
        return await self.metrics.read() if self.metrics is not None else {}

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None
                    ) -> httpx.Response | PoolResponse:
        timeout = httpx.Timeout(self._client_config.control_timeout_s,
                                connect=self._client_config.connect_timeout_s)
        return await send_with_retries(
            self._http, method, self.url, path, body, httpx_timeout=timeout,
            config=attrs.evolve(self._client_config, max_attempts=1),
        )

    async def _read_listing(self) -> list[Any]:
        response = await self._call("GET", "/workers")
        listing = json_object(response, self.url).get("workers")
        if response.status_code != 200 or not isinstance(listing, list):
            raise BackendError(f"gateway {self.url}/workers answered HTTP {response.status_code}")
        return listing

    async def refresh(self) -> None:
        """Re-read ``GET /workers`` and apply what changed.

        New URLs join; URLs it has not listed for :data:`UNLISTED_GRACE_S` leave (a restarted
        gateway lists its workers only after registering them); a removed worker it lists again
        (a restarted gateway reads its launch flags) is deleted from it again. An unreachable
        gateway keeps the current membership; past ``gateway_wait_s`` the fleet fails.

        Raises:
            EngineUnavailableError: the gateway has been unreachable for longer than
                ``gateway_wait_s``, or the fleet failed before.

        Cancellation:
            A checkpoint; membership changes are applied atomically after the read.
        """
        try:
            listing = await self._read_listing()
        except BackendError as exc:
            self._unreachable(exc)
            return
        if self.down_since is not None:
            log.warning("fleet: gateway %s is back", self.url)
            self.down_since = None
        self.listed_at = trio.current_time()
        entries = self._entries(listing)
        listed: dict[str, str | None] = {}
        unhealthy: set[str] = set()
        for url, ids in entries.items():
            # A readmitted worker is joined once the entry of its own registration is healthy
            # (an older entry of its URL may still be listed while the gateway deletes it).
            wanted = self._registered.get(url)
            worker_id = wanted if wanted in ids else next(iter(ids))
            listed[url] = worker_id
            if not ids[worker_id] or (wanted is not None and wanted not in ids):
                unhealthy.add(url)
        self._apply(listed, unhealthy)

    @staticmethod
    def _entries(listing: list[Any]) -> dict[str, dict[str | None, bool]]:
        """URL -> {worker id: healthy} of every entry of a ``GET /workers`` listing."""
        entries: dict[str, dict[str | None, bool]] = {}
        for entry in listing:
            if isinstance(entry, dict):
                url = entry.get("dp_base_url") or entry.get("url")
                if isinstance(url, str):
                    ids = entries.setdefault(url.rstrip("/"), {})
                    ids[entry.get("id")] = entry.get("is_healthy") is not False
        return entries

    def _apply(self, listed: dict[str, str | None], unhealthy: set[str]) -> None:
        members = self._members
        for url, worker_id in listed.items():
            if url in members.removed:
                if url not in self._forgetting and worker_id not in self._deleted:
                    self._nursery.start_soon(self.forget, url, worker_id)
            elif url in members.live:
                members.live[url].worker_id = worker_id
                if url not in unhealthy and members.joining.pop(url, None) is not None:
                    members.notify()  # a readmitted worker now takes generations through us
                self._unlisted.pop(url, None)
            else:
                members.add(url, worker_id)
                log.info("fleet: gateway lists worker %s (%d healthy)", url, len(members.live))
        now = trio.current_time()
        for url in [u for u in members.live if u not in listed]:
            # A (re)started gateway registers its workers in the background, and one we
            # readmitted may not be listed yet: only a worker missing for a while has left.
            since = self._unlisted.setdefault(url, now)
            joined = members.joining.get(url, -math.inf)
            if now - since > UNLISTED_GRACE_S and now - joined > JOIN_GRACE_S:
                self._remove(url, "the gateway no longer lists it")

    def _unreachable(self, exc: BackendError) -> None:
        members = self._members
        now = trio.current_time()
        if self.down_since is None:
            self.down_since = now
            log.warning("fleet: gateway %s unreachable (%s); waiting up to %g s for it",
                        self.url, exc, self._config.gateway_wait_s)
        elif now - self.down_since > self._config.gateway_wait_s and members.fatal is None:
            members.fatal = EngineUnavailableError(
                f"the gateway {self.url} has been unreachable for more than "
                f"{self._config.gateway_wait_s:g} s: {exc}")
        if members.fatal is not None:
            raise members.fatal

    def worker_left(self, url: str, worker_id: str | None) -> None:
        """``url`` left the fleet: forget its listing state and delete it from the gateway."""
        self._unlisted.pop(url, None)
        self._registered.pop(url, None)
        self._nursery.start_soon(self.forget, url, worker_id)

    async def forget(self, url: str, worker_id: str | None) -> None:
        """Delete a removed worker from the gateway at once, so its keys are pinned elsewhere (a
        worker without a known id is found by the next listing, which calls this again).

        smg 1.13 removes a worker in a background job that marks the entry draining, waits
        :data:`SMG_DRAIN_S`, then removes whatever worker is registered under the entry's
        *URL*; a second ``DELETE`` of a draining entry removes it at once. relaxtrio owns
        health and resumes a removed worker's generations itself, so nothing is gained by the
        drain and a dead worker's keys must move now: each entry gets exactly two ``DELETE``s,
        back to back, and the time the first job's drain ends is kept, because that job still
        removes whatever the URL holds then; :meth:`register` waits it out before registering
        the URL again (a worker restarted within the drain lost its new registration).

        Cancellation:
            A checkpoint; a failure is logged, never raised (the id may be deleted again).
        """
        if worker_id is None or url in self._forgetting or worker_id in self._deleted:
            return
        self._forgetting.add(url)
        self._deleted.add(worker_id)
        try:
            for attempt in range(2):
                response = await self._call("DELETE", f"/workers/{worker_id}")
                if attempt == 0 and response.status_code < 300:
                    self._drain_ends[url] = trio.current_time() + SMG_DRAIN_S
                elif response.status_code >= 500:
                    raise BackendError(f"HTTP {response.status_code}")
        except BackendError as exc:
            if url not in self._drain_ends:
                self._deleted.discard(worker_id)
            log.warning("fleet: could not delete worker %s from the gateway: %s", url, exc)
        finally:
            self._forgetting.discard(url)

    async def fresh_listing(self) -> None:
        """:meth:`refresh` unless the last reading is younger than :data:`LISTING_MAX_AGE_S`."""
        if trio.current_time() - self.listed_at > LISTING_MAX_AGE_S:
            await self.refresh()

    async def register(self, url: str) -> None:
        """Register a readmitted worker (``POST /workers``); then re-read the listing in the
        background until it lists the new registration as healthy, for at most
        :data:`JOIN_GRACE_S`.

        The gateway deletes a worker in the background (``DELETE`` answers 202), and a deletion
        still queued when the same URL registers again takes the new registration with it: the
        worker (a fast restart that kept its URL) would get no keys and then leave the fleet as
        unlisted. So every entry of ``url`` still listed is deleted (:meth:`forget`) and waited
        out first (at most :data:`JOIN_GRACE_S`), and so is the end of the drain of the first
        ``DELETE`` of ``url`` (:data:`SMG_DRAIN_S` plus :data:`DRAIN_MARGIN_S`).

        Raises:
            BackendError: the gateway could not be reached.
        """
        self._registered[url] = ""  # no entry listed now is ours: it joins on our POST's
        await self._await_unlisted(url)
        # the first DELETE's job removes whatever the URL holds when its drain ends
        await trio.sleep_until(self._drain_ends.pop(url, 0.0) + DRAIN_MARGIN_S)
        response = await self._call("POST", "/workers", {"url": url})
        try:
            worker_id = response.json().get("worker_id")
        except (ValueError, AttributeError):
            worker_id = None
        if isinstance(worker_id, str):
            self._registered[url] = worker_id
        else:  # a gateway that does not say: any healthy entry of the URL
            self._registered.pop(url, None)
        self._nursery.start_soon(self._await_listed, url)

    async def _await_unlisted(self, url: str) -> None:
        with trio.move_on_after(JOIN_GRACE_S):
            while ids := self._entries(await self._read_listing()).get(url):
                for worker_id in ids:
                    await self.forget(url, worker_id)  # removed now; its drain end is kept
                await trio.sleep(GATEWAY_POLL_S)
            return
        log.warning("fleet: the gateway still lists %s %g s after deleting it; registering it "
                    "again anyway", url, JOIN_GRACE_S)

    async def _await_listed(self, url: str) -> None:
        with trio.move_on_after(JOIN_GRACE_S):
            while url in self._members.joining:
                await trio.sleep(GATEWAY_POLL_S)
                await self.refresh()

    async def wait_reachable(self) -> None:
        """Re-read the listing until the gateway answers (or the fleet fails).

        Raises:
            EngineUnavailableError: it stayed away longer than ``gateway_wait_s``.
        """
        while True:
            await self.refresh()
            if self.down_since is None:
                return
            await trio.sleep(GATEWAY_POLL_S)

    async def await_listing(self, wait_s: float, expect_urls: Sequence[str]) -> None:
        """Poll the listing until it has every URL of ``expect_urls`` (at least one worker
        when empty); past ``wait_s`` go on with a non-empty listing (warned).

        Raises:
            EngineUnavailableError: nothing listed within ``wait_s`` (or the gateway unreachable
                that long).
        """
        expected = {u.rstrip("/") for u in expect_urls}
        members = self._members
        with trio.move_on_after(wait_s):
            while True:
                await self.refresh()
                if members.live and expected <= set(members.live):
                    return
                await trio.sleep(GATEWAY_POLL_S)
        if not members.live:
            raise EngineUnavailableError(f"the gateway {self.url} listed no worker within "
                                         f"{wait_s:g} s")
        log.warning("fleet: after %g s the gateway lists %d of the %d launched workers "
                    "(missing: %s); opening with those listed", wait_s,
                    len(expected & set(members.live)), len(expected),
                    ", ".join(sorted(expected - set(members.live))))
