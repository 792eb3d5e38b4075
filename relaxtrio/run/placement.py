"""Where the parts of a training run execute: the cores split between the trainer in this process
and the embedded engines launched here (:mod:`relaxtrio.cpu_threads`), launched engines and agents
here or on Ray (:mod:`relaxtrio.cluster`, imported only when asked), how weights reach the engines,
and the URL agents reach the agent API at.
"""

from __future__ import annotations

import functools
import logging
import urllib.parse
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager

import attrs
import trio

from .._errors import ConfigError
from ..config import AgentConfig, FleetConfig, TrainRunConfig
from ..cpu_threads import ThreadSplit, available_cpus, split_cpu_threads
from ..fleet.launch_fleet import launch_kind
from ..fleet.starter import EngineStarter
from ..train import Trainer
from ..train.ranks import RankGroup

log = logging.getLogger(__name__)

__all__ = ["advertised_url", "agent_config", "engine_starter", "fleet_config", "thread_split",
           "trainer_threads", "with_engine_threads"]


def thread_split(cfg: TrainRunConfig) -> ThreadSplit:
    """The run's split of the cores between the driver's trainer and the embedded engines it
    launches here (:mod:`relaxtrio.cpu_threads`; looks for SGLang and GPUs)."""
    d = cfg.distributed
    trainer_here = (not cfg.rollout_only and d.world_size == 1 and d.ray_address is None
                    and cfg.train.device == "cpu")
    # Embedded and (CPU) vLLM engines launched here share the cores with the trainer.
    local = cfg.fleet.launches and d.ray_address is None and launch_kind(cfg.fleet) in ("embedded", "vllm")
    return split_cpu_threads(cpus=available_cpus(), num_local_engines=cfg.fleet.num_engines if local else 0,
                             trainer_here=trainer_here, trainer_threads=cfg.trainer_num_threads,
                             engine_threads=cfg.engine_num_threads)


@contextmanager
def trainer_threads(split: ThreadSplit) -> Iterator[None]:
    """Inside, this process's torch threads are the trainer's share (restored on the way out:
    the setting is process-wide)."""
    log.info("%s", split.describe())
    if not split.trainer_threads:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(split.trainer_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def with_engine_threads(cfg: TrainRunConfig, split: ThreadSplit) -> TrainRunConfig:
    """``cfg`` with the engines' share of the cores in their flags (``--num-threads``)."""
    if not split.engine_threads:
        return cfg
    return attrs.evolve(cfg, engine_args=(*cfg.engine_args, "--num-threads", str(split.engine_threads)))


def fleet_config(cfg: TrainRunConfig, trainer: Trainer | RankGroup | None) -> FleetConfig:
    """The fleet settings; a sharded trainer's rank 0 writes each version to disk, so
    ``--weight-sync auto`` means ``disk`` there.

    Raises:
        ConfigError: ``--weight-sync shm`` with a sharded trainer.
    """
    if not isinstance(trainer, RankGroup) or cfg.fleet.weight_sync == "disk":
        return cfg.fleet
    if cfg.fleet.weight_sync == "shm":
        raise ConfigError("--weight-sync shm needs a one-process trainer (the ranks of a sharded "
                          "trainer write their gathered weights to disk)", param="--weight-sync")
    return attrs.evolve(cfg.fleet, weight_sync="disk")


async def engine_starter(cfg: TrainRunConfig, fleet: FleetConfig) -> EngineStarter | None:
    """Where launched engines run: Ray actors with ``--ray-address`` (connects to Ray), else
    None (processes here).

    Raises:
        ConfigError: no Ray cluster at ``--ray-address``.
    """
    d = cfg.distributed
    if d.ray_address is None or not fleet.launches:
        return None
    from ..cluster.engines import RayEngineStarter

    return await trio.to_thread.run_sync(
        functools.partial(RayEngineStarter.connect, d.ray_address, num_cpus=d.engine_num_cpus))


def advertised_url(bound_url: str, advertise_url: str | None) -> str:
    """The ``RELAX_BASE_URL`` agents get: ``advertise_url`` (with the bound port when it names
    none, and the bound path when it has none), or the bound URL itself."""
    if advertise_url is None:
        return bound_url
    want, bound = urllib.parse.urlsplit(advertise_url), urllib.parse.urlsplit(bound_url)
    netloc = want.netloc if want.port is not None else f"{want.hostname}:{bound.port}"
    path = want.path if want.path not in ("", "/") else bound.path
    return urllib.parse.urlunsplit((want.scheme or "http", netloc, path, "", ""))


async def agent_config(cfg: TrainRunConfig, agent: AgentConfig, stack: AsyncExitStack) -> AgentConfig:
    """``agent``, with the Ray agent pool as its launcher for ``--agent-executor ray`` (connects
    to Ray; the pool is entered into ``stack``, which kills every agent actor on the way out).

    Raises:
        ConfigError: no Ray cluster at ``--ray-address``.
    """
    d = cfg.distributed
    if d.agent_executor != "ray":
        return agent
    from ..cluster.agents import open_ray_agent_pool
    from ..cluster.runtime import connect

    assert d.ray_address is not None  # DistributedConfig checks it
    await trio.to_thread.run_sync(connect, d.ray_address, abandon_on_cancel=True)  # SIGTERM still ends the run
    if d.api_host in ("127.0.0.1", "localhost") and d.api_advertise_url is None:
        log.warning("--agent-executor ray with the agent API on loopback: agents placed on other "
                    "nodes cannot reach it (set --agentic-api-host and --agentic-api-advertise-url)")
    pool = await stack.enter_async_context(open_ray_agent_pool(d.agent_num_cpus))
    return attrs.evolve(agent, launcher=pool.run_agent)
