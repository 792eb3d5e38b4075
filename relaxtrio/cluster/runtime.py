"""Connecting to Ray: ``--ray-address auto|ADDRESS`` (or ``RAY_ADDRESS``).

Blocking; the trio driver calls these through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import logging
import socket
import time

import ray

from .._errors import ConfigError

__all__ = ["connect"]

log = logging.getLogger(__name__)


PROBE_TIMEOUT_S = 5.0
"""Seconds the TCP probe of an explicit ``--ray-address HOST:PORT`` may take."""


def _probe(address: str) -> None:
    """Raises ConfigError when ``address`` is ``HOST:PORT`` and nothing accepts a TCP connection
    there (the head node's GCS port); other forms (``auto``, ``ray://...``) are left to Ray."""
    host, sep, port = address.rpartition(":")
    if address == "auto" or "://" in address or not sep or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S):
            pass
    except (OSError, ValueError, OverflowError) as exc:
        raise ConfigError(f"--ray-address {address!r}: no Ray cluster answers there ({exc})",
                          param="--ray-address") from exc


def connect(address: str) -> None:
    """Joins the Ray cluster at ``address`` (``"auto"``: the one ``ray start`` left on this node).

    Does nothing when this process is already connected (a test's ``ray.init``, or a second
    call). The connection lasts until the process exits (or ``ray.shutdown()``); the actors we
    create are ended by their owners (:mod:`~relaxtrio.cluster.trainer`,
    :mod:`~relaxtrio.cluster.agents`), never left behind.

    An explicit ``HOST:PORT`` is probed first (a TCP connect, at most :data:`PROBE_TIMEOUT_S`):
    ``ray.init`` itself retries an unreachable address for a long time, in a thread that a
    SIGTERM cannot interrupt.

    Raises:
        ConfigError: no Ray cluster answers at ``address`` (param ``--ray-address``).
    """
    if ray.is_initialized():
        return
    _probe(address)
    start = time.monotonic()
    try:
        ray.init(address=address, log_to_driver=False)
    except ConnectionError as exc:
        raise ConfigError(f"--ray-address {address!r}: no Ray cluster found ({exc})",
                          param="--ray-address") from exc
    resources = ray.cluster_resources()
    log.info("connected to Ray at %s in %.1f s: %d nodes, %s CPUs, %s GPUs", address,
             time.monotonic() - start, len(ray.nodes()), resources.get("CPU", 0), resources.get("GPU", 0))
