"""Connecting to Ray: ``--ray-address auto|ADDRESS`` (or ``RAY_ADDRESS``).

Blocking; the trio driver calls these through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import logging
import time

import ray

from .._errors import ConfigError

__all__ = ["connect"]

log = logging.getLogger(__name__)


def connect(address: str) -> None:
    """Joins the Ray cluster at ``address`` (``"auto"``: the one ``ray start`` left on this node).

    Does nothing when this process is already connected (a test's ``ray.init``, or a second
    call). The connection lasts until the process exits (or ``ray.shutdown()``); the actors we
    create are ended by their owners (:mod:`~relaxtrio.cluster.trainer`,
    :mod:`~relaxtrio.cluster.agents`), never left behind.

    Raises:
        ConfigError: no Ray cluster answers at ``address`` (param ``--ray-address``).
    """
    if ray.is_initialized():
        return
    start = time.monotonic()
    try:
        ray.init(address=address, log_to_driver=False)
    except ConnectionError as exc:
        raise ConfigError(f"--ray-address {address!r}: no Ray cluster found ({exc})",
                          param="--ray-address") from exc
    resources = ray.cluster_resources()
    log.info("connected to Ray at %s in %.1f s: %d nodes, %s CPUs, %s GPUs", address,
             time.monotonic() - start, len(ray.nodes()), resources.get("CPU", 0), resources.get("GPU", 0))
