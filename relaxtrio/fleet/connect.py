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

The backend (``config.backend``, ``--rollout-backend``) picks the workers' wire protocol here and
nowhere else: vLLM's (:func:`relaxtrio.vllm.connections.open_connections`) or SGLang's native API
(SGLang servers and the embedded engine). Without it, launched engines are of the detected kind
and connected workers that say they are vLLM (``/v1/models`` ``owned_by``) are spoken to as such.
A connected vLLM server must report processed logprobs (``--logprobs-mode processed_logprobs``),
or the trainer would compare its own logprobs at the sampling temperature with raw ones.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import attrs

import httpx

from .._errors import ConfigError
from ..config import Backend, FleetConfig
from ..models import refuse_other_served_models
from ..sglang.client import open_connections as open_sglang_connections
from ..vllm.connections import open_connections as open_vllm_connections
from ..vllm.info import logprobs_mode_problem
from .engine_api import OpenConnections
from .fleet import EngineFleet, open_engine_fleet
from .launch_fleet import EngineKind, LaunchedFleet, open_launched_fleet
from .starter import EngineStarter

__all__ = ["OpenedFleet", "detect_backend", "open_fleet"]


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
    open_connections: OpenConnections | None = None,
) -> AsyncIterator[OpenedFleet]:
    """Launch or connect the engines of ``config`` and open the fleet over them.

    Args:
        config: the fleet settings (``launches`` says which of the two).
        model_dir: the policy model: what launched engines serve, and what connected ones must.
        log_dir: where launched engines and the gateway log (``engine-<i>.log``,
            ``gateway.log``).
        engine_args: extra flags of launched embedded engines.
        kind: the kind of launched engines (default: ``config.backend``, else SGLang where it
            and a GPU are present, else embedded;
            :func:`~relaxtrio.fleet.launch_fleet.detect_engine_kind`).
        starter: where launched engines run (default: processes on this machine).
        open_connections: the workers' wire protocol (default: the backend's, see the module
            docstring).

    Yields:
        The fleet, and what was launched.

    Raises:
        BackendError: an engine or the gateway failed to start, no worker is reachable, or
            (cancelling the body) the fleet can no longer serve.
        ConfigError: a connected engine serves another model than ``model_dir``, a connected
            vLLM server reports raw logprobs, or a launched SGLang / vLLM engine has no
            environment (``--engine-python``).

    Cancellation:
        Leaving stops the monitor and every launched process (shielded).
    """
    async with AsyncExitStack() as stack:
        launched = None
        gateway_url, worker_urls = config.router_url, config.engine_urls
        backend: Backend | None = kind or config.backend
        if config.launches:
            launched = await stack.enter_async_context(open_launched_fleet(
                config, model_dir=model_dir, log_dir=log_dir, engine_args=engine_args, kind=kind,
                starter=starter))
            gateway_url = launched.gateway_url
            worker_urls = () if gateway_url else launched.worker_urls
            backend = launched.kind
        elif backend is None and worker_urls:
            backend = await detect_backend(worker_urls[0])
        if open_connections is None:
            open_connections = open_vllm_connections if backend == "vllm" else open_sglang_connections
        fleet = await stack.enter_async_context(open_engine_fleet(
            config, worker_urls=worker_urls, gateway_url=gateway_url,
            expect_urls=launched.worker_urls if launched else (),
            open_connections=open_connections))
        if launched is not None:
            launched.attach(fleet)
        else:
            await refuse_other_served_models(fleet.model_info, fleet.urls, model_dir)
            if backend == "vllm":
                await _refuse_raw_logprobs(fleet)
        # The engines' counters now: the first step reports its own work, not what an engine
        # served before (a connected server may have run for days).
        await fleet.engine_counters.read(fleet.workers)
        yield OpenedFleet(fleet=fleet, launched=launched)


async def detect_backend(url: str) -> Backend:
    """``vllm`` when the server at ``url`` lists its model as owned by vLLM (``GET
    /v1/models``), else ``sglang`` (SGLang's native API; also an unreachable server, whose
    failure the fleet reports). A checkpoint."""
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            models = (await client.get(url.rstrip("/") + "/v1/models")).json()
        owners = {m.get("owned_by") for m in models.get("data", ()) if isinstance(m, dict)}
    except (httpx.HTTPError, ValueError, AttributeError, TypeError):
        return "sglang"
    return "vllm" if "vllm" in owners else "sglang"


async def _refuse_raw_logprobs(fleet: EngineFleet) -> None:
    """Raises ConfigError naming the first connected vLLM server whose logprobs are not those
    the trainer compares with (:func:`relaxtrio.vllm.info.logprobs_mode_problem`)."""
    for url in fleet.urls:
        problem = logprobs_mode_problem(await fleet.server_info(url))
        if problem is not None:
            raise ConfigError(f"the vLLM server at {url} cannot train: {problem}", param="--engine-url")
